"""Everything that talks to the outside world: processes, Kubernetes, sandboxes, storage, MLflow."""
