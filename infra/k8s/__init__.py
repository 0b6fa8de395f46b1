"""Kubernetes backend: JobSpec -> manifests (``manifests``), the thin API layer (``api``), and the
launcher state machine (``launcher``). Import the submodules; this package imports nothing heavy."""
