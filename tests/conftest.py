"""Shared fixtures: every test gets its own TEMPER_HOME, so nothing touches ./.temper."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def use_embedded_home(mp: pytest.MonkeyPatch, home: Path) -> Path:
    """Point temper (this process and every job it starts) at a fresh embedded home and the shipped
    catalog, with no tracking server or store inherited from the caller's environment."""
    from temper.core.settings import get_settings

    mp.setenv("TEMPER_HOME", str(home))
    mp.setenv("TEMPER_CATALOG_DIR", str(REPO / "domains"))
    for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "TEMPER_S3_ENDPOINT_URL", "MLFLOW_TRACKING_URI"):
        mp.delenv(var, raising=False)
    get_settings.cache_clear()
    return home


@pytest.fixture
def temper_home(tmp_path, monkeypatch):
    """A fresh embedded home (store + sqlite tracking) and the shipped catalog."""
    from temper.core.settings import get_settings

    yield use_embedded_home(monkeypatch, tmp_path / "home")
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """``tiny_model(**init_tiny_kwargs)`` -> the folder of a tiny random Llama, made once per
    distinct set of arguments in the test session (tests that must not share a model use their own)."""
    from temper.training.tiny import init_tiny

    made: dict[tuple, str] = {}

    def make(**kwargs) -> str:
        key = tuple(sorted(kwargs.items()))
        if key not in made:
            made[key] = str(init_tiny(tmp_path_factory.mktemp("tiny") / "model", **kwargs))
        return made[key]

    return make


def pytest_collection_modifyitems(session, config, items):
    """The files marked slow run first. `make test` runs files on two workers (pytest-xdist, one file
    at a time each, the next file to whichever is free): the long files started first leave short
    ones to fill the end, instead of one worker running a 5-minute file while the other is idle.
    A stable sort: the order stays the same in every worker, as xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
