"""Run records: the lifecycle run of a flow, its stage runs, the datasets they consumed, found again by key.

Layout in MLflow: one experiment per flow; a *lifecycle* parent run per flow run; one child run per
stage (validate, sft, grpo, eval, ...). Every dataset a stage consumes is logged as a dataset input
(``log_datasets``: name = domain, digest, source URI), so the registered version -> run -> parent
-> datasets chain can be walked back (``infra.tracking.tree``). The tag names are
``temper.core.tag_names``; MLflow must already point at the store (``infra.tracking.connection``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from temper.core.errors import TrackingError
from temper.core.settings import Settings, get_settings
from temper.core.tag_names import (
    PARENT_TAG,
    RUN_NAME_TAG,
    TAG_BASE_MODEL,
    TAG_CONFIG_HASH,
    TAG_GIT,
    TAG_KIND,
    TAG_RECORD,
    TAG_SHA256,
    TAG_STAGE,
)

MLFLOW_DIGEST_LEN = 32  # MLflow's dataset digest column is VARCHAR(36)


def code_version(repo_dir: Path | None = None) -> str:
    """Git commit of the code that runs, with '-dirty' when the tree has local changes. Outside a git checkout
    (the workload image) the version the image was built with (``TEMPER_CODE_VERSION``, docker/Dockerfile)."""
    repo_dir = repo_dir or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_dir, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_dir,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("TEMPER_CODE_VERSION") or "unknown"
    return sha + ("-dirty" if dirty else "")


def code_fingerprint(repo_dir: Path | None = None) -> str | None:
    """The code exactly: the commit, plus the hash of the local changes to tracked files when there are any
    (``-dirty`` alone would make two different edits look the same; an image's version has it already, as
    scripts/build-image.sh writes it); None when nothing can tell."""
    repo_dir = repo_dir or Path(__file__).resolve().parents[2]
    version = code_version(repo_dir)
    if version == "unknown":
        return None
    if not version.endswith("-dirty"):
        return version
    try:
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=repo_dir, capture_output=True, check=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{version}-{hashlib.sha256(diff).hexdigest()[:16]}"


def config_hash(config: Any) -> str:
    """Stable short hash of a config (pydantic model or JSON-able object)."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@contextlib.contextmanager
def lifecycle_run(experiment: str, run_name: str, *, config: Any = None, base_model: str | None = None,
                  tags: dict[str, str] | None = None) -> Iterator[Any]:
    """The parent run of one lifecycle (flow) run. Ends FAILED if the body raises."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow

    try:
        use_experiment(experiment)
    except Exception as e:
        raise TrackingError(f"cannot open MLflow experiment {experiment!r} at {mlflow.get_tracking_uri()}: {e}") from None
    all_tags = {TAG_KIND: "lifecycle", TAG_GIT: code_version(), **(tags or {})}
    if config is not None:
        all_tags[TAG_CONFIG_HASH] = config_hash(config)
    if base_model:
        all_tags[TAG_BASE_MODEL] = base_model
    with mlflow.start_run(run_name=run_name, tags=all_tags) as run:
        if config is not None:
            mlflow.log_dict(config.model_dump(mode="json") if hasattr(config, "model_dump") else config,
                            "config.json")
        yield run


@contextlib.contextmanager
def stage_run(stage: str, *, parent_run_id: str | None = None, tags: dict[str, str] | None = None) -> Iterator[Any]:
    """A child run for one stage, nested under the active (or given) lifecycle run."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow

    active = mlflow.active_run()
    parent = parent_run_id or (active.info.run_id if active else None)
    all_tags = {TAG_KIND: "stage", TAG_STAGE: stage, TAG_GIT: code_version(), **(tags or {})}
    if parent:
        all_tags[PARENT_TAG] = parent
    with mlflow.start_run(run_name=stage, nested=active is not None, tags=all_tags) as run:
        yield run


def log_dataset(name: str, frame: Any, source_uri: str, sha256: str, context: str = "training") -> None:
    """Record a consumed dataset on the active run: name, digest, source."""
    log_datasets([(name, frame, source_uri, sha256)], context)


DATASETS_PER_REQUEST = 100  # MLflow takes up to 1,000 (MAX_DATASETS_PER_BATCH); each carries its schema


def log_datasets(items: Iterable[tuple[str, Any, str, str]], context: str = "training") -> None:
    """Record consumed datasets, ``(name, frame, source URI, sha256)`` each, on the active run, in batched
    requests: at hundreds of domains a request per dataset was most of the cost (300 datasets against an MLflow
    server: 10.5 s, 4.8 s of it the server's, vs 3.1-4.3 s in 3 requests). ``items`` is read a batch at a time,
    so only a batch's frames are held."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow

    items = iter(items)
    while batch := list(itertools.islice(items, DATASETS_PER_REQUEST)):
        mlflow.log_inputs([mlflow.data.from_pandas(frame, source=uri, name=name, digest=sha256[:MLFLOW_DIGEST_LEN])
                           for name, frame, uri, sha256 in batch],
                          contexts=[context] * len(batch), tags_list=[{TAG_SHA256: sha256} for *_, sha256 in batch])


def use_experiment(experiment: str, settings: Settings | None = None) -> Any:
    """``mlflow.set_experiment`` that keeps embedded artifacts under TEMPER_HOME, not ./mlruns.

    With a sqlite tracking URI MLflow would put artifacts relative to the current directory;
    a tracking server decides artifact locations itself.
    """
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow

    settings = settings or get_settings()
    if settings.resolved_tracking_uri.startswith("sqlite:") and mlflow.get_experiment_by_name(experiment) is None:
        location = (settings.resolved_artifact_root / experiment).as_uri()
        try:
            mlflow.create_experiment(experiment, artifact_location=location)
        except mlflow.exceptions.MlflowException:
            pass  # created concurrently by another task: fine
    return mlflow.set_experiment(experiment)


# ---- runs that span many Prefect tasks ------------------------------------------------------
# Prefect tasks may run in other threads, where MLflow's fluent "active run" is not set, so
# long-lived runs are created and ended with the client and re-entered by id where needed.

def open_run(experiment: str, run_name: str, *, tags: dict[str, str] | None = None,
             parent_run_id: str | None = None) -> str:
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.tracking import MlflowClient

    exp = use_experiment(experiment)
    all_tags = {TAG_GIT: code_version(), RUN_NAME_TAG: run_name, **(tags or {})}
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    return MlflowClient().create_run(exp.experiment_id, run_name=run_name, tags=all_tags).info.run_id


def close_run(run_id: str, status: str = "FINISHED") -> None:
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.tracking import MlflowClient

    MlflowClient().set_terminated(run_id, status=status)


@contextlib.contextmanager
def resume_run(run_id: str) -> Iterator[Any]:
    """Re-enter a run by id to log to it with the fluent API, leaving its status RUNNING."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow
    from mlflow.tracking import MlflowClient

    with mlflow.start_run(run_id=run_id) as run:
        yield run
    MlflowClient().update_run(run_id, status="RUNNING")


# ---- records found again by a deterministic key (find-or-create) ----------------------------
# A continued flow run (`temper resume`) or a retried task must find the records an earlier attempt
# made instead of creating a second lifecycle run or a second eval run of the same thing. Each
# record carries TAG_RECORD; its value is derived from the run key (the flow run that started it).

def keyed_runs(experiment: str, key: str) -> list[Any]:
    """Live (not deleted) runs recorded under ``key``, newest first."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.tracking import MlflowClient

    exp = use_experiment(experiment)
    runs = MlflowClient().search_runs([exp.experiment_id], f"tags.`{TAG_RECORD}` = '{key}'", max_results=100)
    return sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True)


def open_keyed_run(experiment: str, key: str, run_name: str, *, tags: dict[str, str] | None = None,
                   parent_run_id: str | None = None, fresh: bool = False) -> tuple[str, bool]:
    """The run recorded under ``key``: (run id, True) when it already existed, else a new one (id, False).

    An existing run is set RUNNING again and its tags updated; further runs under the same key (a
    race of two attempts) are deleted, so one remains. ``fresh``: a record that is written in one go
    (an eval run): an unfinished one is half written, so it is deleted and made anew; a FINISHED
    one is returned as it is.
    """
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    runs = keyed_runs(experiment, key)
    keep = next((r for r in runs if r.info.status == "FINISHED"), None) if fresh else (runs[0] if runs else None)
    for r in runs:
        if r is not keep:
            client.delete_run(r.info.run_id)
    if keep is None:
        return open_run(experiment, run_name, tags={**(tags or {}), TAG_RECORD: key}, parent_run_id=parent_run_id), False
    if not fresh:
        for k, v in (tags or {}).items():
            client.set_tag(keep.info.run_id, k, v)
        client.update_run(keep.info.run_id, status="RUNNING")
    return keep.info.run_id, True
