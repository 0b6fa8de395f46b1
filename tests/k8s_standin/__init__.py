"""A stand-in Kubernetes cluster on 127.0.0.1 for tests: API server, controllers, one node.

See ``cluster.StandinCluster`` and docs/kubernetes.md ("The stand-in cluster") for what it
imitates and what still needs a real cluster.
"""
