"""Real servers on 127.0.0.1, one of each per test session: MLflow tracking, moto S3."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from temper.commands.up import wait_healthy
from temper.core.errors import TemperError
from temper.core.tag_names import TAG_STAGE

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    """`temper up`'s wait, with the server's last log lines in the failure and the server killed."""
    try:
        wait_healthy(url, proc, log, timeout)
    except TemperError as e:
        proc.kill()
        raise RuntimeError(f"{e}: {log.read_text()[-2000:]}") from None


def stop_process(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM, then SIGKILL, to the process's whole session (servers' workers, flow-run and
    training children too): every server here is started with ``start_new_session=True``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(grace_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def running_mlflow(root: Path, host: str = "127.0.0.1"):
    """`mlflow server` with a sqlite backend and proxied artifacts, listening on ``host``; yields its URI."""
    port = free_port()
    log = root / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--host", host, "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts"],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    uri = f"http://{host}:{port}"
    _wait_http(uri + "/health", proc, 120, log)
    try:
        yield uri
    finally:
        stop_process(proc)


@contextlib.contextmanager
def running_moto(root: Path, host: str = "127.0.0.1"):
    """moto's S3-compatible server listening on ``host``; yields its endpoint URL."""
    port = free_port()
    log = root / "server.log"
    exe = shutil.which("moto_server", path=str(BIN)) or str(BIN / "moto_server")
    proc = subprocess.Popen([exe, "-H", host, "-p", str(port)], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{host}:{port}"
    _wait_http(url, proc, 60, log)
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """`mlflow server` with a sqlite backend and proxied artifacts; yields its URI."""
    with running_mlflow(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3-compatible server; yields its endpoint URL."""
    with running_moto(tmp_path_factory.mktemp("moto")) as url:
        yield url


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Settings pointed at a fresh bucket on the moto server."""
    import uuid

    import boto3

    from temper.core.settings import get_settings

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"temper-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=bucket)
    monkeypatch.setenv("TEMPER_S3_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("TEMPER_STORAGE_ROOT", f"s3://{bucket}/temper")
    get_settings.cache_clear()
    yield bucket
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """A real temporary Prefect server (Prefect's own test harness), one per session."""
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path_factory.mktemp("prefect-results"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        from prefect.settings import PREFECT_API_URL

        yield PREFECT_API_URL.value()


@pytest.fixture
def tracked(temper_home, mlflow_server, monkeypatch):
    """The embedded home, tracking to the session's MLflow server."""
    from temper.core.settings import get_settings

    monkeypatch.setenv("TEMPER_TRACKING_URI", mlflow_server)
    get_settings.cache_clear()
    return mlflow_server


def generate(*domains: str) -> None:
    """Write the named catalog domains' datasets, as `temper data generate --domain ...` does."""
    from temper.cli import main

    assert main(["data", "generate", *[a for d in domains for a in ("--domain", d)]]) == 0


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module's in-process models on the shared 2-core machine;
    restored for whatever runs after the module (``pytestmark = pytest.mark.usefixtures(...)``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def flow_env(tracked, prefect_api, request):
    """Tracking + a Prefect API, and the datasets of the test module's ``FLOW_DOMAINS`` generated."""
    generate(*getattr(request.module, "FLOW_DOMAINS", ("arithmetic",)))
    return prefect_api


@pytest.fixture
def k8s_cluster(tmp_path):
    """A stand-in Kubernetes cluster on 127.0.0.1 (tests/k8s_standin): API server + controllers + one node.

    Yields a ``StandinCluster``: ``.api_client`` (official client), ``.kubeconfig`` (file for
    ``load_config()``/KUBECONFIG), ``.create_namespace(name, service_accounts, priority_classes)``,
    ``.evict(ns, pod)``, ``.kill(ns, pod)``, ``.hold_scheduling(s)``, ``.leftovers(ns)``,
    ``.wait_for(what, predicate)``, ``.shared_dir`` (a directory every pod sees at the same path,
    outside the pods' /tmp emptyDirs) and ``.errors`` (controller exceptions; must stay empty).
    Images: ``temper-workload:latest`` is this checkout at /app with the test venv on PATH.
    """
    from tests.conftest import REPO
    from tests.k8s_standin.cluster import StandinCluster, workload_image

    image = workload_image(REPO, BIN.parent)
    cluster = StandinCluster(tmp_path / "k8s-standin", {"temper-workload:latest": image})
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.errors, "stand-in controllers raised:\n" + "\n".join(cluster.errors)


class RestartableMlflow:
    """`mlflow server` over one sqlite file and artifact folder, stoppable and restartable on its port."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        root.mkdir(parents=True, exist_ok=True)
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        log = self.root / "server.log"
        self.proc = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--serve-artifacts"],
            stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        _wait_http(self.uri + "/health", self.proc, 120, log)

    def stop(self) -> None:
        stop_process(self.proc)

    def grpo_steps_logged(self) -> int:
        """Steps of GRPO loss the store holds so far (read from the sqlite file, whether or not the server is up)."""
        with sqlite3.connect(self.root / "mlflow.db") as db:
            row = db.execute("SELECT COUNT(*) FROM metrics m JOIN tags t ON t.run_uuid = m.run_uuid "
                             "WHERE t.key = ? AND t.value = 'grpo' AND m.key = 'loss'", (TAG_STAGE,)).fetchone()
        return row[0]


@pytest.fixture
def own_mlflow(tmp_path, temper_home, prefect_api, monkeypatch):
    from temper.core.settings import get_settings

    server = RestartableMlflow(tmp_path / "mlflow")
    monkeypatch.setenv("TEMPER_TRACKING_URI", server.uri)
    get_settings.cache_clear()
    generate("arithmetic")
    yield server
    server.stop()


def store_processes(*preload: str):
    """A multiprocessing context for tests that hammer one store from many real processes: each starts as a fork
    of a fresh server process that imported MLflow and ``preload`` once (``forkserver``), not as a new interpreter
    importing them again (``spawn``: ~4 s of CPU a process, 24 processes in the registry tests). Each is still its
    own process, with its own MLflow client and store connection made after it starts; the caller's threads are
    never forked. The server starts with the first call in a process (its ``preload`` then holds) and keeps the
    environment of that moment, so targets run through ``in_env`` with the caller's."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["mlflow.tracking", "temper.core.settings", *preload])
    return ctx


def in_env(env: dict[str, str], target, *args) -> None:
    """Run ``target(*args)`` in ``env``: a ``store_processes`` process has its server's environment."""
    from temper.core.settings import get_settings

    os.environ.clear()
    os.environ.update(env)
    get_settings.cache_clear()
    target(*args)


def run_grpo_with_worker(fields: dict, config: Path, worker: str) -> list[str]:
    """A 2-rank GRPO job launched as `training_job` launches it (ranks, env, rendezvous), each rank running
    ``worker`` (a test module wrapping ``workloads.train`` to record what the run did) instead of the
    workload itself; its output lines. Fails the test if the job does not exit 0."""
    import yaml

    from infra.launcher_local import run_job
    from temper.core.settings import get_settings
    from temper.training.config import nest_stage_fields
    from temper.training.job import training_job

    config.write_text(yaml.safe_dump(nest_stage_fields({"mode": "grpo", "tracking": False, "save_steps": 1000,
                                                        "seed": 0, **fields})))
    job = training_job(str(config), "grpo")
    job = job.model_copy(update={"command": [sys.executable, "-m", worker, *job.command[3:]]})
    lines: list[str] = []
    status = run_job(job, on_line=lines.append, cwd=str(Path(__file__).resolve().parents[2]))
    get_settings.cache_clear()
    assert status == 0, "\n".join(lines[-60:])
    return lines


def without_retry_waits(mp: pytest.MonkeyPatch) -> None:
    """Every Prefect task in tasks/ and flows/ keeps its retries but waits 0 s between them.

    For tests whose failure is deterministic: every attempt fails the same way, so the production
    waits (2-15 s, there to outlast an outage) prove nothing and cost ~20 s per case. The number
    of attempts, which those tests count, is unchanged. Flows run in this process pick it up."""
    import importlib
    import pkgutil

    from prefect import Task

    import flows
    import tasks

    for package in (tasks, flows):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for obj in vars(module).values():
                if isinstance(obj, Task) and obj.retries and obj.retry_delay_seconds:
                    mp.setattr(obj, "retry_delay_seconds", 0)
