"""Shared fixtures: every test gets its own TEMPER_HOME, so nothing touches ./.temper."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


@pytest.fixture
def temper_home(tmp_path, monkeypatch):
    """A fresh embedded home (store + sqlite tracking) and the shipped catalog."""
    from temper.core.settings import get_settings

    monkeypatch.setenv("TEMPER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TEMPER_CATALOG_DIR", str(REPO / "domains"))
    for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "TEMPER_S3_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    get_settings.cache_clear()
    yield tmp_path / "home"
    get_settings.cache_clear()
