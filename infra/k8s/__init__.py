"""Kubernetes backend: JobSpec -> manifests (``manifests``), cluster options and their loader
(``options``), the thin API layer (``api``), the launcher state machine (``launcher``), and the
executor that runs inside sandbox pods (``sandbox_exec``, used by ``infra.sandbox.kubernetes``).
Import the submodules; this package imports nothing heavy."""
