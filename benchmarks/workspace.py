"""A throwaway embedded temper for one benchmark run: temp TEMPER_HOME, the shipped catalog,
no tracking server, shared store or Prefect result cache inherited from the caller's environment."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def embedded_workspace(prefix: str) -> Path:
    """A new temp dir that this process's temper (and every job it launches) treats as home."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    # Prefect's result storage too: the flow's validation results are cached by name and digest,
    # and a run that found the previous run's results in ~/.prefect/storage would time a cache read.
    os.environ.update({"TEMPER_HOME": str(root / "home"), "TEMPER_CATALOG_DIR": str(REPO / "domains"),
                       "GX_ANALYTICS_ENABLED": "false", "PREFECT_LOCAL_STORAGE_PATH": str(root / "prefect-storage")})
    for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "MLFLOW_TRACKING_URI"):
        os.environ.pop(var, None)
    return root
