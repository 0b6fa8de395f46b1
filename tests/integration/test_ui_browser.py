"""The Prefect UI as a person uses it: headless Chromium starts a post-training run.

A real `prefect server start` (it serves the UI), the `post-training` deployment of
prefect.yaml served from a subprocess with small parameters (ui_serve_deployment.py), and
Playwright driving Debian's /usr/bin/chromium: deployments page -> post-training -> Run ->
Quick run -> View run. The run must reach Completed, both in the API and on the flow-run
page of the UI. On failure a screenshot and the server logs land in the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import BIN, _wait_http, free_port, stop_process

CHROMIUM = Path("/usr/bin/chromium")
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODEL = "temper-ui-test"
# The smallest whole run (one GRPO step, one rank, no SFT stage, 4 eval items): the two-rank ZeRO-3
# path and SFT are test_flow_post_training's; this test is about the UI driving a run to its end.
SMALL = {"model_name": MODEL, "domains": ["arithmetic", "multiplication"], "sft": {"enabled": False},
         "grpo": {"max_steps": 1}, "eval": {"limit": 4}, "world_size": 1}
DEPLOYMENT_TIMEOUT_S = 120  # serve process up and the deployment registered
RUN_TIMEOUT_S = 300  # the flow run from the click to a final state
UI_TIMEOUT_MS = 30_000  # one UI step (page load, element visible)
QUICK_RUN_ATTEMPTS = 3  # clicks on Quick run before the test gives up (see _quick_run)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                               "(scripts/system-deps.sh installs it)")]


def _log_tail(path: Path, n: int = 3000) -> str:
    return f"--- {path.name} ---\n" + (path.read_text(errors="replace")[-n:] if path.exists() else "(none)")


@pytest.fixture
def prefect_server(tmp_path):
    """`prefect server start` with its own PREFECT_HOME; yields (API URL, base env, log)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    home = tmp_path / "prefect-home"
    home.mkdir()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": f"{url}/api", "PREFECT_UI_API_URL": f"{url}/api", "PREFECT_UI_URL": url,
           "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false", "DO_NOT_TRACK": "1",
           "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true",  # a locked SQLite's 503s show in the server log
           "PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "prefect-results")}
    log = tmp_path / "prefect-server.log"
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_http(f"{url}/api/health", proc, 180, log)
        yield f"{url}/api", env, log
    finally:
        stop_process(proc)


@pytest.fixture
def served_deployment(temper_home, mlflow_server, prefect_server, tmp_path):
    """Datasets generated, then the post-training deployment served.

    Yields (API URL, serve log, server log, serve process).
    """
    api, env, server_log = prefect_server
    env = {**env, "TEMPER_HOME": os.environ["TEMPER_HOME"], "TEMPER_CATALOG_DIR": os.environ["TEMPER_CATALOG_DIR"],
           "TEMPER_TRACKING_URI": mlflow_server, "TEMPER_PREFECT_API_URL": api,
           "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    gen = subprocess.run([str(BIN / "temper"), "data", "generate", "--domain", "arithmetic",
                          "--domain", "multiplication"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, str(HERE / "ui_serve_deployment.py"), json.dumps(SMALL)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        yield api, log, server_log, proc
    finally:
        stop_process(proc)


def _prefect(api: str, fn):
    """fn(client) against this test's server, whatever Prefect settings the session has active.

    The sync client: Playwright's sync API keeps an event loop running in this thread.
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        return fn(client)


def _wait_deployment(api: str, proc: subprocess.Popen, log: Path):
    from prefect.exceptions import ObjectNotFound

    def read(client):
        try:
            return client.read_deployment_by_name("post_training/post-training")
        except ObjectNotFound:
            return None

    deadline = time.monotonic() + DEPLOYMENT_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve process exited with {proc.returncode}\n{_log_tail(log)}"
        deployment = _prefect(api, read)
        if deployment is not None:
            return deployment
        time.sleep(1)
    pytest.fail(f"deployment post_training/post-training not registered after {DEPLOYMENT_TIMEOUT_S}s\n"
                f"{_log_tail(log)}")


def _wait_final(api: str, flow_run_id: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        flow_run = _prefect(api, lambda c: c.read_flow_run(flow_run_id))
        if flow_run.state is not None and flow_run.state.is_final():
            return flow_run
        assert proc.poll() is None, f"serve process exited with {proc.returncode}\n{_log_tail(log)}"
        time.sleep(2)
    pytest.fail(f"flow run {flow_run_id} not finished after {RUN_TIMEOUT_S}s: {flow_run.state}\n{_log_tail(log)}")


def _quick_run(page, api_errors: list[str]):
    """Run -> Quick run, as a person does; returns the toast of the run it scheduled.

    On a loaded machine Prefect's SQLite server answers a write it could not lock in time with 503
    ("Service Unavailable", logged only with PREFECT_SERVER_LOG_RETRYABLE_ERRORS): its Python client retries
    those, its UI shows "Failed to schedule flow run" and creates nothing. A person clicks again; so does this,
    up to QUICK_RUN_ATTEMPTS times, and fails naming the API calls that failed.
    """
    from playwright.sync_api import expect

    # Prefect's UI mounts its toast app twice: two identical toasts, stacked, the later one on top (it takes
    # the pointer). They leave 5 s after they show: once one shows, the caller reads the name and clicks at once.
    scheduled = page.locator(".toast-flow-run-create").filter(visible=True).last
    failed = page.get_by_text("Failed to schedule flow run").filter(visible=True)
    for _ in range(QUICK_RUN_ATTEMPTS):
        run_button = page.locator("button.run-menu__run-button")
        expect(run_button).to_be_enabled()
        run_button.click()
        page.get_by_text("Quick run", exact=True).click()
        expect(scheduled.or_(failed.last)).to_be_visible(timeout=UI_TIMEOUT_MS)
        if scheduled.is_visible():
            expect(scheduled).to_contain_text("scheduled to start now")
            return scheduled
        print(f"Quick run refused by the server (failed API calls so far: {api_errors}); clicking again",
              file=sys.stderr)
        expect(failed).to_have_count(0, timeout=UI_TIMEOUT_MS)  # the error toasts leave before the next click
    pytest.fail(f"no Quick run scheduled in {QUICK_RUN_ATTEMPTS} clicks; failed API calls: {api_errors}")


def test_quick_run_of_post_training_from_the_ui_completes(served_deployment, tmp_path):
    from playwright.sync_api import expect, sync_playwright
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    api, serve_log, server_log, serve_proc = served_deployment
    ui = api.removesuffix("/api")
    deployment = _wait_deployment(api, serve_proc, serve_log)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(UI_TIMEOUT_MS)
        api_errors: list[str] = []  # the UI's failed API calls, for the failure report
        page.on("response", lambda r: api_errors.append(f"{r.request.method} {r.url} -> {r.status}")
                if "/api/" in r.url and r.status >= 400 else None)
        try:
            page.goto(f"{ui}/deployments", wait_until="domcontentloaded")
            link = page.get_by_role("link", name="post-training", exact=True)
            expect(link).to_be_visible()
            link.click()
            page.wait_for_url(re.compile(rf"/deployments/deployment/{deployment.id}"))
            toast = _quick_run(page, api_errors)
            run_name = toast.locator(".toast-flow-run-create__message--emphasized").first.inner_text()
            toast.get_by_role("button", name="View run").click()
            page.wait_for_url(re.compile(r"/runs/flow-run/[0-9a-f-]{36}"))
            flow_run_id = re.search(r"/flow-run/([0-9a-f-]{36})", page.url).group(1)
            run_page = page.url
            # the wait is the API's: the page, drawing its live run graph in software (no GPU), took ~60 s of
            # CPU from the run it shows; it is opened again once the run is final (its heading polls every 30 s)
            page.goto("about:blank")

            flow_run = _wait_final(api, flow_run_id, serve_proc, serve_log)
            assert str(flow_run.deployment_id) == str(deployment.id)
            assert flow_run.parameters["params"]["model_name"] == MODEL  # the deployment's small defaults
            assert flow_run.state.is_completed(), f"{flow_run.state}\n{_log_tail(serve_log)}"
            runs = _prefect(api, lambda c: c.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))))
            assert [str(r.id) for r in runs] == [flow_run_id]  # one click, one run

            page.goto(run_page, wait_until="domcontentloaded")
            badge = page.locator(".page-heading-flow-run .state-badge")
            expect(badge).to_have_text("Completed")
            expect(badge).to_have_class(re.compile(r"state--completed"))
            assert run_name == flow_run.name
            expect(page.locator(".page-heading-flow-run")).to_contain_text(flow_run.name)
        except BaseException:
            shot = tmp_path / "ui-failure.png"
            try:
                page.screenshot(path=str(shot), full_page=True)
                (tmp_path / "ui-failure.html").write_text(page.content())
            except Exception as e:  # a crashed browser must not hide the failure itself
                shot = f"(none: {e})"
            print(f"screenshot: {shot}\nfailed API calls: {api_errors}\n{_log_tail(serve_log)}\n"
                  f"{_log_tail(server_log)}", file=sys.stderr)
            raise
        finally:
            browser.close()
