"""`temper up`: a local Prefect server, a local MLflow server, and every deployment served.

    Prefect UI  http://127.0.0.1:4200   (post-training, evaluate, human-validation ...: run from
                                         the UI form; retrain: cron and dataset-change trigger)
    MLflow UI   http://127.0.0.1:5000

Both servers keep their state under TEMPER_HOME. The MLflow server serves the embedded store
itself (the sqlite file and artifact folder `temper demo` writes), so models a demo registered
are in the UI, and runs made under `temper up` are there for the next demo. A TEMPER_TRACKING_URI
pointing at a server is used as is (no local MLflow server). Ctrl-C stops the deployments and
both servers (their whole process groups).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from temper.core.errors import TemperError


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    """Until ``url`` answers below 500; one line naming the log if the server exits or stays down."""
    # lazy: requests (70 ms) would load at every `temper` start-up
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TemperError(f"{proc.args[0]} exited with {proc.returncode}; see {log}")
        try:
            if requests.get(url, timeout=2).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TemperError(f"{url} not healthy after {timeout_s:.0f}s; see {log}")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def mlflow_server_argv(settings, host: str, port: int) -> list[str] | None:
    """The `mlflow server` serving the embedded store (same sqlite, same artifact root); None for a remote URI.

    Artifacts are not proxied: writers through this server and `temper demo` writing sqlite
    directly both put files under ``settings.resolved_artifact_root``, one folder per experiment.
    """
    uri = settings.resolved_tracking_uri
    if uri.startswith(("http://", "https://")):
        return None
    return [str(Path(sys.executable).parent / "mlflow"), "server", "--host", host, "--port", str(port),
            "--workers", "1", "--backend-store-uri", uri,
            "--default-artifact-root", settings.resolved_artifact_root.as_uri(), "--no-serve-artifacts"]


def up(args: argparse.Namespace) -> int:
    # lazy: pydantic_settings (130 ms), via settings, would load at every `temper` start-up
    from temper.core.settings import get_settings

    settings = get_settings()
    home = settings.home.resolve()
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    prefect_url = f"http://{args.host}:{args.prefect_port}"
    mlflow_url = f"http://{args.host}:{args.mlflow_port}"
    env = {**os.environ, "PREFECT_HOME": str(home / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    mlflow_argv = mlflow_server_argv(settings, args.host, args.mlflow_port)
    if mlflow_argv is None:
        mlflow_url = settings.resolved_tracking_uri
    else:
        settings.resolved_artifact_root.mkdir(parents=True, exist_ok=True)
        if (home / "mlflow-server.db").exists():  # what `temper up` served before there was one store
            print(f"note: {home / 'mlflow-server.db'} (an older `temper up` store) is no longer served; "
                  f"serving {settings.resolved_tracking_uri}", flush=True)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_start([str(bin_dir / "prefect"), "server", "start", "--host", args.host,
                             "--port", str(args.prefect_port)], logs / "prefect.log", env))
        if mlflow_argv:
            procs.append(_start(mlflow_argv, logs / "mlflow.log", env))
        wait_healthy(prefect_url + "/api/health", procs[0], logs / "prefect.log")
        if mlflow_argv:
            wait_healthy(mlflow_url + "/health", procs[1], logs / "mlflow.log")
        os.environ.update({"PREFECT_API_URL": prefect_url + "/api", "TEMPER_TRACKING_URI": mlflow_url,
                           "PREFECT_HOME": env["PREFECT_HOME"]})
        get_settings.cache_clear()
        # lazy: prefect+yaml (1.3 s), via deployments, would load at every `temper` start-up
        from prefect import serve

        from flows.deployments import read_entries, servable

        deployments = servable(read_entries())
        print(f"Prefect UI: {prefect_url}\nMLflow UI:  {mlflow_url}\n"
              f"serving {len(deployments)} deployments: {', '.join(d.name for d in deployments)}\n"
              "Ctrl-C stops everything.", flush=True)
        serve(*deployments, print_starting_message=False)
    except KeyboardInterrupt:
        pass
    finally:
        for p in reversed(procs):
            _stop(p)
        print("temper up: stopped Prefect and MLflow", flush=True)
    return 0


def register(sub) -> None:
    p = sub.add_parser("up", help="local Prefect + MLflow servers and all deployments served (Ctrl-C stops)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--prefect-port", type=int, default=4200)
    p.add_argument("--mlflow-port", type=int, default=5000)
    p.set_defaults(func=up)
