"""`temper resume`: a post_training run whose flow process was SIGKILLed mid-GRPO is continued to the
same model and the same records as an uninterrupted run; MLflow down past the retry budget fails the
continuation with one line, and the next `temper resume` completes the records.

The flow runs in a subprocess (`temper demo --params`) against the session's real Prefect server and
the test's own restartable `mlflow server` (tests/integration/test_faults.py); the reference is the
same GRPO stage run as a plain training job (what post_training runs, minus the flow around it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from temper.core.tag_names import PARENT_TAG, TAG_KIND, TAG_LIFECYCLE_RUN, TAG_RECORD, TAG_STAGE
from tests.conftest import REPO
from tests.integration.conftest import BIN, free_port, stop_process

MODEL = "temper-resume"
STEPS = 6


def _params():
    from temper.lifecycle.params import EvalSettings, GRPOSettings, PostTrainingParams, SFTStage

    return PostTrainingParams(model_name=MODEL, domains=["arithmetic"], sft=SFTStage(enabled=False), world_size=1,
                              grpo=GRPOSettings(max_steps=STEPS, save_steps=2, max_completion_length=48), eval=EvalSettings(limit=8))


def _flow_runs(**filters):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["post_training"])), **filters)


def _flow_run(run_id):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def _reference_job(home: Path, out: Path) -> None:
    """The GRPO stage of the same parameters as one uninterrupted training job, untracked."""
    from infra.launcher_local import run_job
    from tasks.training import stage_config
    from temper.training.job import training_job

    cfg = stage_config("grpo", _params().resolved(), str(home / "models" / "tiny"), "reference", out)
    cfg = cfg.model_copy(update={"tracking": False})
    config = out / "grpo.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False))
    lines: list[str] = []
    assert run_job(training_job(str(config), "grpo"), on_line=lines.append, cwd=str(REPO)) == 0, "\n".join(lines[-30:])


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.fixture
def resume_env(own_mlflow, prefect_api):
    return own_mlflow, {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONPATH": str(REPO)}


def _temper(env: dict, *args: str, log: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "temper"), *args], cwd=str(REPO), env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True, **kw)


@pytest.mark.slow
def test_sigkilled_flow_is_resumed_to_the_uninterrupted_model_and_records_and_an_outage_fails_in_one_line(
        resume_env, temper_home, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    server, env = resume_env
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(_params().model_dump(mode="json")))
    t0 = time.monotonic()

    # 1. The flow runs in its own process; once a GRPO checkpoint before the last is committed to the store,
    # SIGKILL it. Completions of 48 tokens make a step long enough to notice (with 4, a quiet machine ran all
    # 6 steps in ~0.2 s, and the store keeps only the last 2 checkpoints).
    flow = _temper(env, "demo", "--params", str(params_file), log=tmp_path / "flow.log")
    store = temper_home / "store" / "runs"
    deadline = time.monotonic() + 600
    while not [p for n in range(2, STEPS, 2) for p in store.glob(f"pt-*-grpo/checkpoints/checkpoint-{n}/temper_state.json")]:
        assert flow.poll() is None, (tmp_path / "flow.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no GRPO checkpoint in 600 s"
        time.sleep(0.02)
    os.kill(flow.pid, signal.SIGKILL)
    flow.wait()
    killed_at = time.monotonic() - t0
    key = next(store.glob("pt-*-grpo")).name.removesuffix("-grpo")
    # Its training job runs in its own session and would run on, orphaned: on a quiet machine it finished
    # all 6 steps before the continuation came, which then rightly skipped the finished stage. Killed here
    # too, as when the machine running the flow goes down, so the continuation must resume from a
    # checkpoint; that the next attempt stops a job left running is test_a_job_left_running_... below.
    orphan_group = int((temper_home / "jobs" / f"grpo-{key}-grpo.pid").read_text().split()[0])
    os.killpg(orphan_group, signal.SIGKILL)
    [killed] = [r for r in _flow_runs() if str(r.id).startswith(key.removeprefix("pt-"))]
    assert killed.state.type.value == "RUNNING"  # Prefect cannot know: the process never reported
    assert killed.infrastructure_pid == f"{socket.gethostname()}:{flow.pid}"
    assert f"should this process die: temper resume {killed.id}" in (tmp_path / "flow.log").read_text()

    reference = tmp_path / "reference"
    ref_job = threading.Thread(target=_reference_job, args=(temper_home, reference))
    ref_job.start()  # overlaps the next two phases (the machine's cores are otherwise idle in the waits)

    # 2. MLflow stays down past the (2 s) retry budget: the continuation fails with one line naming the server.
    server.stop()
    log = tmp_path / "resume-down.log"
    down = _temper({**env, "TEMPER_TRACKING_RETRY_S": "2"}, "resume", str(killed.id), log=log)
    assert down.wait(300) == 1, log.read_text()[-3000:]
    output = log.read_text()
    last = output.strip().splitlines()[-1]
    assert last.startswith("temper: error: flow run ") and f"MLflow tracking server {server.uri} is unreachable" in last
    assert "retried for 2 s" in last and "temper resume " in last, last
    assert "urllib3" not in output and "Traceback" not in last
    assert _flow_run(killed.id).state.type.value == "CRASHED"  # marked by the first `temper resume`
    [failed] = [r for r in _flow_runs() if (r.parameters or {}).get("continues") == str(killed.id)]
    assert failed.state.type.value == "FAILED" and str(failed.id) in last

    # 3. The server is back: resuming the failed continuation continues the same run and completes it.
    server.start()
    log = tmp_path / "resume.log"
    ok = _temper(env, "resume", str(failed.id), log=log)
    assert ok.wait(900) == 0, log.read_text()[-4000:]
    output = log.read_text()
    assert f"continuing post_training run {key}" in output
    # training continued from the newest complete checkpoint: 2, or 4 or 6 if the job got that far before its
    # kill (on a quiet machine a step of this tiny run takes ~30 ms, faster than the test can notice and kill);
    # from the last one no step is trained again, the export is its model
    [resumed_from] = [int(line.rsplit("checkpoint-", 1)[1]) for line in output.splitlines() if "resuming from" in line]
    assert 2 <= resumed_from <= STEPS and f"grpo step {STEPS + 1}/" not in output, output[-4000:]
    assert resumed_from == STEPS or f"grpo step {resumed_from + 1}/{STEPS}" in output, output[-4000:]
    assert "grpo step 1/" not in output  # not started over
    ref_job.join()
    took = time.monotonic() - t0
    done = [r for r in _flow_runs() if (r.parameters or {}).get("continues") == str(killed.id)
            and r.state.type.value == "COMPLETED"]
    assert len(done) == 1

    # The model equals the uninterrupted run's, and so does every logged loss (steps redone after the
    # kill were logged twice, each time with the same value).
    resumed = temper_home / "runs" / key / "grpo"
    ref_w, got_w = _weights(reference / "grpo" / "model"), _weights(resumed / "model")
    assert ref_w.keys() == got_w.keys()
    assert max((ref_w[k] - got_w[k]).abs().max().item() for k in ref_w) < 1e-5
    ref_losses = {r["step"]: r["loss"] for r in map(json.loads, (reference / "grpo" / "metrics.jsonl").read_text().splitlines())
                  if "loss" in r}
    assert sorted(ref_losses) == list(range(1, STEPS + 1))

    # One lifecycle run, one record per stage under it, nothing else in the experiment; one version.
    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name("post_training")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    [lifecycle] = [r for r in runs if r.data.tags.get(TAG_KIND) == "lifecycle"]
    assert lifecycle.data.tags[TAG_RECORD] == key and lifecycle.info.status == "FINISHED"
    children = [r for r in runs if r is not lifecycle]
    assert all(r.data.tags.get(PARENT_TAG) == lifecycle.info.run_id for r in children)  # no orphans
    assert sorted(r.info.run_name for r in children) == sorted(
        [f"grpo-{key}-grpo", "eval-base-arithmetic", "eval-candidate-arithmetic", "register"])
    assert all(r.info.status == "FINISHED" for r in children)
    [grpo] = [r for r in children if r.data.tags.get(TAG_STAGE) == "grpo"]
    history = client.get_metric_history(grpo.info.run_id, "loss")
    assert {m.step for m in history} == set(ref_losses)
    assert max(abs(m.value - ref_losses[m.step]) for m in history) < 1e-5
    versions = client.search_model_versions(f"name = '{MODEL}'")
    assert [v.tags.get(TAG_LIFECYCLE_RUN) for v in versions] == [lifecycle.info.run_id]

    # What finished is not done again: validation came from Prefect's cache (same digest and contract).
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as pc:
        tasks = pc.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[done[0].id])))
    assert {t.name: t.state.name for t in tasks}["validate-arithmetic"] == "Cached"
    # A finished run is not resumed again, from any of its flow runs.
    from temper.cli import main

    for ref in (killed.id, failed.id):
        assert main(["resume", str(ref)]) == 1
        assert f"was finished by flow run {done[0].id}: nothing to resume" in capsys.readouterr().err
    print(f"\nkilled after {killed_at:.0f} s, resumed from checkpoint-{resumed_from}; whole test {took:.0f} s")


def test_a_job_left_running_by_a_dead_caller_is_stopped_before_its_next_attempt(tmp_path):
    """The launcher records each job's process group; the next attempt of the same job stops the group a
    dead caller left behind, and leaves alone a process that merely reuses the recorded pid."""
    from infra.launcher_local import _start_ticks, stop_leftover

    orphan = subprocess.Popen([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); "
                               "time.sleep(60)"], start_new_session=True)
    try:
        time.sleep(0.5)
        claim = tmp_path / "jobs" / "grpo-x.pid"
        claim.parent.mkdir()
        claim.write_text(f"{orphan.pid} 1")  # same pid, another start time: not the job's process
        assert stop_leftover(claim, on_line=lambda _: None) is False and orphan.poll() is None
        claim.write_text(f"{orphan.pid} {_start_ticks(orphan.pid)}")
        # a dead caller's job is reaped by init the moment it dies; this one is our child, so reap it
        # here (an unreaped zombie still holds its process group: stop_leftover would wait its grace out)
        threading.Thread(target=orphan.wait, daemon=True).start()
        lines: list[str] = []
        assert stop_leftover(claim, on_line=lines.append) is True
        assert orphan.wait(5) is not None and not claim.exists()
        with pytest.raises(ProcessLookupError):
            os.killpg(orphan.pid, 0)  # the child it started went with it
        assert "left running by an earlier attempt" in lines[0]
    finally:
        stop_process(orphan, grace_s=2)


def test_an_mlflow_call_that_outlasts_the_budget_is_one_line_naming_the_server(temper_home, monkeypatch):
    """A real MLflow client call against a port nothing listens on, with a 1 s budget: one
    TrackingUnreachable line naming the server, what was being done and the budget."""
    from mlflow.tracking import MlflowClient

    from infra.tracking.connection import configure, outage_named
    from temper.core.errors import TrackingUnreachable
    from temper.core.settings import get_settings

    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("TEMPER_TRACKING_URI", uri)
    monkeypatch.setenv("TEMPER_TRACKING_RETRY_S", "1")
    get_settings.cache_clear()
    with pytest.raises(TrackingUnreachable) as e:
        configure(wait=True)
    assert str(e.value).startswith(f"MLflow tracking server {uri} is unreachable (retried for 1 s")
    import mlflow

    mlflow.set_tracking_uri(uri)
    t0 = time.monotonic()
    with pytest.raises(TrackingUnreachable) as e, outage_named("the test's search"):
        MlflowClient().search_experiments()
    assert time.monotonic() - t0 >= 1.5  # MLflow's own retries waited the budget (2 retries, 2 s)
    message = str(e.value)
    assert "\n" not in message and uri in message and "during the test's search" in message


def test_resume_of_an_unknown_finished_live_or_foreign_flow_run_is_one_line_and_changes_nothing(
        prefect_api, temper_home, capsys):
    """From the command line as a user types it: an id that is not one, an unknown one, a finished
    post_training run, a run of another flow, a run whose process is alive. One line each, exit 1, no
    flow run created or changed, no MLflow store made."""
    import uuid

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Failed, Running

    from flows.post_training import post_training
    from temper.cli import main
    from temper.lifecycle.resume import process_tag

    @flow(name="not_post_training")
    def other() -> None:
        pass

    with get_client(sync_client=True) as client:
        finished = client.create_flow_run(post_training, parameters={"params": {}}, state=Completed())
        foreign = client.create_flow_run(other, state=Failed())
        alive = client.create_flow_run(post_training, parameters={"params": {}}, state=Running())
        client.update_flow_run(alive.id, infrastructure_pid=process_tag())

        def snapshot() -> dict:
            return {r.id: (r.state.type, r.state.name) for r in client.read_flow_runs()}

        before = snapshot()
        capsys.readouterr()  # what importing the flow printed (library deprecation warnings)
        cases = [("not-a-run", "not a flow run id"), (str(uuid.uuid4()), "no such flow run in the Prefect API"),
                 (str(finished.id), "finished (Completed): nothing to resume"),
                 (str(foreign.id), "is a run of flow 'not_post_training'"),
                 (str(alive.id), f"is Running and its process {process_tag()} is alive")]
        for ref, message in cases:
            assert main(["resume", ref]) == 1, ref
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("temper: error: flow run ") and message in err[0], err
        assert snapshot() == before
    assert not (temper_home / "mlflow.db").exists()


def test_eval_records_are_found_by_key_not_made_twice(tracked):
    """record_eval twice for the same (lifecycle run, model, domain) gives one FINISHED run; a half-written
    one an earlier attempt left RUNNING is replaced; recorded_evals reads the finished results back."""
    from mlflow.tracking import MlflowClient

    from infra.tracking.connection import configure
    from infra.tracking.runs import keyed_runs, open_keyed_run, open_run
    from temper.lifecycle.evaluation import eval_key, record_eval, recorded_evals, summary

    configure()
    parent = open_run("post_training", "pt-keytest")
    result = {"domain": "arithmetic", "model": "/m", "dataset_uri": "/d", "dataset_sha256": "ab" * 32, "n": 2,
              "mean_reward": 0.5, "pass_rate": 0.5, "scored": 2, "wall_s": 0.1, "ids": ["a", "b"], "rewards": [1.0, 0.0]}
    assert recorded_evals(parent, "candidate", ["arithmetic"]) is None
    half, _ = open_keyed_run("post_training", eval_key(parent, "candidate", "arithmetic"), "eval-candidate-arithmetic",
                                     parent_run_id=parent)  # an attempt killed while logging
    first = record_eval(result, "candidate", parent)
    assert first != half and MlflowClient().get_run(half).info.lifecycle_stage == "deleted"
    assert record_eval(result, "candidate", parent) == first
    runs = keyed_runs("post_training", eval_key(parent, "candidate", "arithmetic"))
    assert [r.info.run_id for r in runs] == [first] and runs[0].info.status == "FINISHED"
    # read back, the same summary the first attempt passed on
    assert recorded_evals(parent, "candidate", ["arithmetic"]) == [summary({**result, "run_id": first})]
    assert recorded_evals(parent, "candidate", ["arithmetic", "multiplication"]) is None
