"""MLflow lineage: which data, code, config and parent runs produced each run and model version.

Layout in MLflow: one experiment per flow; a *lifecycle* parent run per flow run; one
child run per stage (validate, sft, grpo, eval, ...). Every dataset a stage consumes is
logged with ``mlflow.log_input`` (name = domain, digest, source URI), so the registered
version -> run -> parent -> datasets chain can be walked back (``lineage_tree``; what
``temper lineage`` prints is the graph ``temper.registry.lineage_graph`` builds from it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temper.core.errors import TrackingError, TrackingUnreachable
from temper.core.settings import Settings, get_settings

# Tag keys, in one place.
TAG_KIND = "temper.kind"  # lifecycle | stage
TAG_STAGE = "temper.stage"
TAG_GIT = "temper.git_commit"
TAG_CONFIG_HASH = "temper.config_hash"
TAG_BASE_MODEL = "temper.base_model"
TAG_SHA256 = "temper.sha256"
TAG_RECORD = "temper.record"  # the deterministic key a record is found by again (find-or-create)
PARENT_TAG = "mlflow.parentRunId"
MLFLOW_DIGEST_LEN = 32  # MLflow's dataset digest column is VARCHAR(36)


def configure(settings: Settings | None = None, *, existing: bool = False, wait: bool = False) -> str:
    """Point MLflow at the configured tracking URI; fail fast if a server is unreachable.

    ``existing``: the caller only reads (lineage, models): an embedded store that does not exist
    yet is an error naming where it was looked for, not a new empty database in the current folder.
    ``wait``: a flow stage or a training job, which rides out a server restart: the health check
    keeps trying for the retry budget (``tracking_retry_s``) before it gives up. Every MLflow call of
    this process (and of the jobs it starts, which inherit the environment) retries for that budget too.
    """
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow

    # MLflow writes "View run ... at URL" to stdout; it would corrupt `--json` output.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    settings = settings or get_settings()
    os.environ.update(mlflow_retry_env(settings.tracking_retry_s))
    uri = settings.resolved_tracking_uri
    _check_scheme(uri)
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if existing and not db.is_file():
            raise TrackingError(f"no temper registry at {db}: nothing was tracked here yet (run `make demo` in this "
                                "checkout, or set TEMPER_HOME or TEMPER_TRACKING_URI)")
        db.parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    if uri.startswith(("http://", "https://")):
        _check_health(uri, settings.tracking_retry_s if wait else 0)
    return uri


def _check_scheme(uri: str) -> None:
    """A tracking URI whose scheme MLflow has no store for (``foo://x``) is one line naming it, here, rather
    than MLflow's traceback at the first call that needs the store."""
    try:  # MLflow's own table of schemes (plugins add theirs), private: without it the first call reports
        # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry as stores
        from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException as Unsupported
    except ImportError:
        return
    try:
        stores.get_store_builder(uri)
    except Unsupported:
        schemes = ", ".join(s for s in getattr(stores, "_registry", {}) if s)
        raise TrackingError(f"tracking URI {uri!r} (TEMPER_TRACKING_URI): MLflow has no store for scheme "
                            f"{uri.split(':', 1)[0]!r}; use one of {schemes} or a local path") from None


def mlflow_retry_env(budget_s: float) -> dict[str, str]:
    """MLflow's client retry knobs for a budget: the fewest retries (factor 1, else more) whose backoff
    sleeps (urllib3: 0, 2f, 4f, ... each capped at 120 s) add up to at least ``budget_s``."""
    for factor in range(1, 121):
        total = 0.0
        for retries in range(0, 11):  # MLflow refuses more than 10 (_MLFLOW_HTTP_REQUEST_MAX_RETRIES_LIMIT)
            if total >= budget_s:
                return {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
                        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(factor)}
            total += 0 if retries == 0 else min(120.0, factor * 2 ** retries)
    return {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "10", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "120"}


def _check_health(uri: str, budget_s: float) -> None:
    # lazy: requests (70 ms) would load in fast unit tests (test_domain_roles.py)
    import requests

    deadline = time.monotonic() + budget_s
    while True:
        try:
            requests.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
            return
        except requests.RequestException as e:
            if time.monotonic() >= deadline:
                raise unreachable(uri, budget_s, type(e).__name__) from None
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))


def unreachable(uri: str, budget_s: float, detail: str, during: str | None = None) -> TrackingUnreachable:
    """The one line for a tracking server that stayed away: which server, for how long, what was being done."""
    tried = f" (retried for {budget_s:.0f} s, TEMPER_TRACKING_RETRY_S)" if budget_s else ""
    e = TrackingUnreachable(f"MLflow tracking server {uri} is unreachable{tried}"
                            + (f" during {during}" if during else "") + f": {detail}")
    e.parts = (uri, budget_s, detail) if during is None else None  # what outage_named completes with its `during`
    return e


def is_outage(e: BaseException) -> bool:
    """A failure to reach the tracking server (refused, reset, timed out) after MLflow's own retries,
    as opposed to a request the server answered with an error."""
    # lazy: requests (70 ms) would load in fast unit tests (test_domain_roles.py)
    import requests

    if isinstance(e, TrackingUnreachable | requests.ConnectionError | requests.Timeout | ConnectionError):
        return True
    text = str(e)
    return "API request to" in text and any(m in text for m in (
        "Max retries exceeded", "Connection refused", "Connection aborted", "Connection reset", "timed out",
        "RemoteDisconnected", "NewConnectionError"))


@contextlib.contextmanager
def outage_named(during: str) -> Iterator[None]:
    """Turn MLflow's failure to reach the server (a urllib3 traceback in an MlflowException) into one
    TrackingUnreachable line naming the server, the budget and ``during``. Usable as a decorator."""
    try:
        yield
    except TrackingUnreachable as e:
        if getattr(e, "parts", None) is None:
            raise
        raise unreachable(*e.parts, during) from None
    except Exception as e:
        if not is_outage(e):
            raise
        # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
        import mlflow

        raise unreachable(mlflow.get_tracking_uri(), get_settings().tracking_retry_s,
                          type(e).__name__, during) from None


def code_version(repo_dir: Path | None = None) -> str:
    """Git commit of the code that runs, with '-dirty' when the tree has local changes."""
    repo_dir = repo_dir or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_dir, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_dir,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


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
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow

    ds = mlflow.data.from_pandas(frame, source=source_uri, name=name, digest=sha256[:MLFLOW_DIGEST_LEN])
    mlflow.log_input(ds, context=context, tags={TAG_SHA256: sha256})


# ---- reading lineage back -------------------------------------------------------------------

@dataclass
class DatasetRef:
    name: str
    digest: str
    source: str
    context: str | None


@dataclass
class RunNode:
    run_id: str
    name: str
    experiment_id: str
    tags: dict[str, str]
    datasets: list[DatasetRef] = field(default_factory=list)
    parent: "RunNode | None" = None


@dataclass
class LineageTree:
    ref: str
    model_version: dict[str, Any] | None
    run: RunNode


def _run_node(client: Any, run_id: str, depth: int = 0) -> RunNode:
    run = client.get_run(run_id)
    datasets = []
    for di in run.inputs.dataset_inputs if run.inputs else []:
        ctx = next((t.value for t in di.tags if t.key == "mlflow.data.context"), None)
        source = di.dataset.source
        try:
            source = json.loads(source).get("uri", source)
        except (TypeError, ValueError, AttributeError):
            pass
        datasets.append(DatasetRef(name=di.dataset.name, digest=di.dataset.digest, source=source, context=ctx))
    tags = {k: v for k, v in run.data.tags.items() if k.startswith("temper.")}
    node = RunNode(run_id=run_id, name=run.info.run_name, experiment_id=run.info.experiment_id, tags=tags,
                   datasets=datasets)
    parent_id = run.data.tags.get(PARENT_TAG)
    if parent_id and depth < 10:
        node.parent = _run_node(client, parent_id, depth + 1)
    return node


def lineage_tree(ref: str) -> LineageTree:
    """Resolve ``MODEL@ALIAS``, ``MODEL/VERSION`` or a run id to its lineage tree."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    mv = None
    try:
        if "@" in ref:
            name, alias = ref.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        elif "/" in ref:
            name, version = ref.rsplit("/", 1)
            mv = client.get_model_version(name, version)
        run_id = mv.run_id if mv else ref
        if not run_id:
            raise TrackingError(f"{ref}: model version has no producing run")
        run = _run_node(client, run_id)
    except MlflowException as e:
        raise TrackingError(f"{ref}: not found in {client.tracking_uri}: {e.message.splitlines()[0]}") from None
    version = None
    if mv:
        version = {"name": mv.name, "version": mv.version, "aliases": list(mv.aliases or []), "source": mv.source,
                   "run_id": mv.run_id}
    return LineageTree(ref=ref, model_version=version, run=run)


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
    all_tags = {TAG_GIT: code_version(), "mlflow.runName": run_name, **(tags or {})}
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
