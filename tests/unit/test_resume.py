"""What `temper resume` may continue, the run key it keeps, and the tracking retry budget (pure logic)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from infra.tracking.connection import is_outage, mlflow_retry_env
from temper.core.settings import Settings
from temper.lifecycle.resume import ResumeError, check_resumable, origin, process_alive, process_tag, run_key_of

RUN = "0f1e2d3c-aaaa-bbbb-cccc-000000000000"


def test_a_continued_run_keeps_the_key_of_the_flow_run_that_started_it():
    assert run_key_of(RUN) == "pt-0f1e2d3c"
    assert run_key_of("11111111-0000", continues=RUN) == "pt-0f1e2d3c"
    # resuming a continuation continues the same run, not the continuation's own key
    assert origin("22222222-0000", {"params": {}, "continues": RUN}) == RUN
    assert origin(RUN, {"params": {}}) == RUN


def test_finished_runs_other_flows_and_live_processes_are_refused():
    with pytest.raises(ResumeError, match="finished"):
        check_resumable(RUN, "post_training", "COMPLETED", "Completed", None)
    with pytest.raises(ResumeError, match="a run of flow 'retrain'"):
        check_resumable(RUN, "retrain", "FAILED", "Failed", None)
    with pytest.raises(ResumeError, match="is alive"):
        check_resumable(RUN, "post_training", "RUNNING", "Running", process_tag())
    with pytest.raises(ResumeError, match="cannot be checked from this machine"):
        check_resumable(RUN, "post_training", "RUNNING", "Running", "other-host:1")
    with pytest.raises(ResumeError, match="cannot be checked from this machine"):
        check_resumable(RUN, "post_training", "RUNNING", "Running", None)
    with pytest.raises(ResumeError, match="not a run that stopped"):
        check_resumable(RUN, "post_training", "SCHEDULED", "Scheduled", None)


def test_a_run_that_ended_is_continued_and_a_dead_running_one_is_marked_crashed_first():
    for state in ("FAILED", "CRASHED", "CANCELLED"):
        assert check_resumable(RUN, "post_training", state, state.title(), None) is False
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tag = f"{process_tag().rpartition(':')[0]}:{dead.pid}"
    assert process_alive(tag) is False
    assert check_resumable(RUN, "post_training", "RUNNING", "Running", tag) is True
    assert process_alive(f"{process_tag().rpartition(':')[0]}:{os.getpid()}") is True


def test_the_retry_budget_becomes_mlflow_client_retries_that_wait_at_least_that_long():
    def waited(env: dict[str, str]) -> float:  # urllib3: retry 1 at once, retry k after f * 2**(k-1), <= 120 s
        n, f = int(env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]), int(env["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"])
        return sum(min(120, f * 2 ** (k - 1)) for k in range(2, n + 1))

    for budget in (1, 3, 12, 240, 600, 1080):  # 1080: the settings' maximum
        env = mlflow_retry_env(budget)
        assert int(env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) <= 10  # MLflow refuses more
        assert budget <= waited(env) < 2 * budget + 4, (budget, env)
    with pytest.raises(ValidationError):
        Settings(tracking_retry_s=1081)
    assert mlflow_retry_env(240) == {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "8", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def test_only_failures_to_reach_the_server_count_as_an_outage():
    refused = Exception("API request to http://127.0.0.1:9/api/2.0/mlflow/runs/search failed with exception "
                        "HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: ...")
    assert is_outage(refused) and is_outage(ConnectionRefusedError())
    assert not is_outage(Exception("RESOURCE_DOES_NOT_EXIST: Run 'abc' not found"))
    assert not is_outage(ValueError("bad value"))
