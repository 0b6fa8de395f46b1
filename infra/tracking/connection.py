"""The MLflow connection: where the tracking store is, and riding out a tracking server that is away.

``configure`` points MLflow at the configured store (and checks a server is there); every MLflow
call of the process then retries for the budget ``tracking_retry_s`` (``mlflow_retry_env``), and
``outage_named`` turns a server that stayed away longer into one line naming it and what was being
done. Run records are ``infra.tracking.runs``; reading them back is ``infra.tracking.tree``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from temper.core.errors import TrackingError, TrackingUnreachable
from temper.core.settings import Settings, get_settings


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
