"""Local jobs forked from the pre-imported job zygote (infra/job_zygote.py), through run_job as every local job
starts: served jobs see the preloaded libraries, get their own argv, environment, directory, random state and
exit status; cancelling or SIGKILLing the job's process group (what run_job and stop_leftover do) leaves no
process; a job whose import environment differs starts as a fresh interpreter. Training through the zygote
equals a fresh process's losses: test_training.py, test_flow_post_training_k8s.py (cluster pods are fresh)."""

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from infra.job_zygote import CLIENT, socket_for
from infra.jobspec import JobSpec
from infra.launcher_local import CANCEL_EXIT, run_job

PROBE = '''
import json, os, random, sys, time
import numpy as np
served = "transformers" in sys.modules
from huggingface_hub import constants
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "flag": os.environ.get("PROBE_FLAG"),
                  "served": served, "pid": os.getpid(), "random": random.random(), "np": float(np.random.rand()),
                  "hf_home": constants.HF_HOME}), flush=True)
if "sleep" in sys.argv:
    time.sleep(60)
if "raise" in sys.argv:
    raise ValueError("the probe failed as asked")
sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)
'''


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "probe_job.py").write_text(PROBE)
    return tmp_path


def run(probe, *args, env=None, **kw) -> tuple[int, list[dict], list[str]]:
    import json

    lines: list[str] = []
    spec = JobSpec(name="probe", kind="eval", command=[sys.executable, "-m", "probe_job", *args], env=env or {})
    status = run_job(spec, on_line=lines.append, cwd=str(probe), **kw)
    return status, [json.loads(line) for line in lines if line.startswith("{")], lines


def test_a_served_job_has_its_own_argv_env_directory_random_state_and_status(probe):
    status, (out,), _ = run(probe, "a", "b", "3", env={"PROBE_FLAG": "on"})
    assert status == 3 and out["served"], out  # the zygote's transformers: no import in the job
    assert out["argv"] == ["a", "b", "3"] and out["cwd"] == str(probe) and out["flag"] == "on"
    status, (again,), _ = run(probe)
    assert status == 0 and again["served"] and again["flag"] is None  # nothing of the last job's environment
    assert again["random"] != out["random"] and again["np"] != out["np"]  # reseeded per job, as a fresh process
    status, _, lines = run(probe, "raise")
    assert status == 1 and any("ValueError: the probe failed as asked" in line for line in lines)


def test_an_import_environment_gets_its_own_zygote_and_a_process_that_differs_from_its_zygote_starts_fresh(
        probe, tmp_path):
    """HF_HOME is read when huggingface_hub is imported: a job with another one is served by a zygote that imported
    with it (run_job keys zygotes by that environment); a process sent to a zygote of another one (a rank whose
    launcher changed it) runs as a fresh interpreter instead."""
    import json

    elsewhere = str(tmp_path / "elsewhere")
    status, (out,), _ = run(probe, env={"HF_HOME": elsewhere})
    assert status == 0 and out["served"] and out["hf_home"] == elsewhere
    path = socket_for(dict(os.environ))
    fresh = subprocess.run([sys.executable, CLIENT, path, "-m", "probe_job"], cwd=probe, capture_output=True, text=True,
                           env={**os.environ, "HF_HOME": elsewhere + "2"}, check=True)
    out = json.loads(fresh.stdout)
    assert not out["served"] and out["hf_home"] == elsewhere + "2"


def test_cancelling_a_served_job_kills_it(probe):
    cancel = threading.Event()
    seen: list[dict] = []

    def on_line(line: str) -> None:
        if line.startswith("{"):
            import json

            seen.append(json.loads(line))
            cancel.set()

    spec = JobSpec(name="probe", kind="eval", command=[sys.executable, "-m", "probe_job", "sleep"])
    t = time.monotonic()
    assert run_job(spec, on_line=on_line, cwd=str(probe), cancel=cancel) == CANCEL_EXIT
    assert time.monotonic() - t < 30 and seen[0]["served"]
    assert not psutil.pid_exists(seen[0]["pid"]) or psutil.Process(seen[0]["pid"]).status() == "zombie"


def test_sigkill_of_the_clients_group_kills_the_job(probe):
    """What stop_leftover does to a job whose caller died: SIGKILL its process group, which holds only the client."""
    import json

    path = socket_for(dict(os.environ))
    assert path is not None
    proc = subprocess.Popen([sys.executable, CLIENT, path, "-m", "probe_job", "sleep"], cwd=probe,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    out = json.loads(proc.stdout.readline())
    assert out["served"] and psutil.pid_exists(out["pid"])
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(out["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(out["pid"]), "the job outlived its client"
