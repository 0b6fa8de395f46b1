"""A throwaway embedded temper for one benchmark run: temp TEMPER_HOME, the shipped catalog,
no tracking server or shared store inherited from the caller's environment."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def embedded_workspace(prefix: str) -> Path:
    """A new temp dir that this process's temper (and every job it launches) treats as home."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ.update({"TEMPER_HOME": str(root / "home"), "TEMPER_CATALOG_DIR": str(REPO / "domains"),
                       "GX_ANALYTICS_ENABLED": "false"})
    for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "MLFLOW_TRACKING_URI"):
        os.environ.pop(var, None)
    return root
