"""A 2-pod ZeRO-3 SFT run submitted by infra/k8s/launcher.py to the stand-in cluster.

What is real: the Indexed Job + headless Service from ``infra.k8s.manifests`` (the objects
``temper k8s render`` prints), every client call of ``ClusterApi``, the launcher's watch/log
following/retry, the stand-in's Job controller, scheduler and kubelet, and the training: two
pods, each one ``accelerate launch`` of one rank, that rendezvous over torch.distributed gloo at
``<job>-0.<job>:<port>`` (resolved by the stand-in's DNS) and shard the model with DeepSpeed
ZeRO-3. Each pod's ``output_dir`` is its own /tmp emptyDir, as on a cluster; checkpoints go to
the store (a local path every pod sees: ``k8s_cluster.shared_dir``), so a retried Job resumes
from the store, not from a pod's disk.

The same config also runs through the local launcher (one machine, two processes): its losses
must equal the pods' (same seed, same world size), and both timings are printed.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import yaml

from infra.jobspec import Resources
from infra.k8s.api import ClusterApi
from infra.k8s.errors import JobFailed
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.options import KubernetesOptions
from temper.training.config import nest_stage_fields
from tests.conftest import REPO, use_embedded_home

pytestmark = pytest.mark.slow
NS = "temper"
DOMAINS = ["arithmetic", "multiplication"]
STEPS = 12
TIMINGS: dict[str, dict[str, float]] = {}
POD_OUT = "/tmp/temper-run"  # output_dir inside each pod: its /tmp emptyDir


@pytest.fixture(scope="module")
def workspace(tiny_model):
    """Datasets, the tiny model and the configs, outside /tmp (pods get their own /tmp)."""
    import tempfile

    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset

    root = Path(tempfile.mkdtemp(prefix="k8s-train-", dir="/var/tmp"))
    with pytest.MonkeyPatch.context() as mp:
        use_embedded_home(mp, root / "home")
        catalog = load_catalog(REPO / "domains")
        for name in DOMAINS:
            generate_domain_dataset(catalog[name])
        shutil.copytree(tiny_model(), root / "tiny")
        yield root
    get_settings.cache_clear()
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(POD_OUT, ignore_errors=True)  # training_job wrote the launch configs here, on this machine


def write_config(root: Path, name: str, output_dir: str) -> Path:
    cfg = {"run_name": name, "domains": DOMAINS, "output_dir": output_dir, "tracking": False, "seed": 0,
           "mode": "sft", "base_model": str(root / "tiny"), "max_steps": STEPS, "save_steps": 3,
           "learning_rate": 1e-3, "per_device_batch_size": 4}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(nest_stage_fields(cfg)))
    return path


def k8s_spec(root: Path, name: str):
    """The JobSpec a flow would submit: training_job's, as 2 pods x 1 rank with the image's paths."""
    from temper.training.job import training_job

    config = write_config(root, name, output_dir=POD_OUT)  # each pod's own emptyDir
    spec = training_job(str(config), "sft")
    env = {**spec.env, "TEMPER_HOME": str(root / "home"), "TEMPER_CATALOG_DIR": "/app/domains"}
    return spec.model_copy(update={
        "command": ["python", "-m", "workloads.train", "sft", "--config", str(config)],
        "nodes": 2, "procs_per_node": 1, "env": env, "retries": 1, "timeout_s": 600,
        "accelerate_config": "/app/docker/accelerate-zero3-multinode-cpu.yaml",
        "resources": Resources(cpu="1", memory="3Gi", shm_size="512Mi")})


def options(port: int) -> KubernetesOptions:
    return KubernetesOptions(namespace=NS, priority_class=None, s3_secret=None, poll_interval_s=0.5,
                             rendezvous_port=port, ttl_seconds_after_finished=2)


def rank0_metrics(cluster, job: str) -> dict[int, float]:
    """Losses rank 0 logged, read from its pod's emptyDir on the node (it outlives the pod here)."""
    rows = []
    for path in sorted((cluster.root / "pods").glob(f"{NS}_{job}-0-*_*/volumes/tmp/temper-run/metrics.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


class Timer:
    """Submission -> first training step, and -> the end, from the launcher's log lines."""

    def __init__(self) -> None:
        self.t0, self.first, self.lines, self.at = time.monotonic(), None, [], []

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        self.at.append(time.monotonic() - self.t0)
        if self.first is None and re.search(r"sft step \d+/", line):
            self.first = time.monotonic() - self.t0


def run_on_cluster(cluster, root: Path, name: str, on_line=None) -> tuple[str, Timer]:
    from tests.integration.conftest import free_port

    launcher = KubernetesLauncher(ClusterApi(cluster.api_client), options(free_port()))
    timer = Timer()

    def log(line: str) -> None:
        timer(line)
        if on_line:
            on_line(line)

    job = launcher.run(k8s_spec(root, name), on_log=log)
    timer.total = time.monotonic() - timer.t0
    return job, timer


def test_two_pods_rendezvous_shard_and_match_the_local_run(k8s_cluster, workspace):
    k8s_cluster.create_namespace(NS)
    job, timer = run_on_cluster(k8s_cluster, workspace, "straight")
    assert job == "sft-straight", timer.lines[-30:]
    logs = "\n".join(timer.lines)
    assert "[sft-straight-0-" in logs and "[sft-straight-1-" in logs  # both pods' logs were followed
    k8s = rank0_metrics(k8s_cluster, "sft-straight")
    assert sorted(k8s) == list(range(1, STEPS + 1)), logs[-3000:]
    shards = [p for p in (k8s_cluster.root / "pods").glob(f"{NS}_sft-straight-*_*/volumes/tmp/temper-run/shards-rank*.json")]
    parts = {p.name: json.loads(p.read_text()) for p in shards}
    assert sorted(parts) == ["shards-rank0.json", "shards-rank1.json"], shards  # one rank per pod
    full = parts["shards-rank0.json"]["full_numel"]
    assert all(0 < s["local_numel"] < full for s in parts.values())  # ZeRO-3: each pod holds a part
    # a loaded 2-core machine (the whole suite at once) took over 30 s for TTL + garbage collection
    k8s_cluster.wait_for("namespace empty (TTL + GC)", lambda: k8s_cluster.leftovers(NS) == {}, timeout=120)
    TIMINGS["kubernetes (stand-in)"] = {"first_step_s": timer.first, "total_s": timer.total}

    # the same run through the local launcher: one machine, two processes
    from infra.launcher_local import run_job
    from temper.training.job import training_job

    local_timer = Timer()
    config = write_config(workspace, "local", output_dir=str(workspace / "local"))
    status = run_job(training_job(str(config), "sft"), on_line=local_timer, cwd=str(REPO))
    local_timer.total = time.monotonic() - local_timer.t0
    assert status == 0, local_timer.lines[-30:]
    TIMINGS["local launcher"] = {"first_step_s": local_timer.first, "total_s": local_timer.total}
    local = {r["step"]: r["loss"] for r in map(json.loads, (workspace / "local" / "metrics.jsonl").read_text().splitlines())
             if "loss" in r}
    for step in local:
        assert abs(k8s[step] - local[step]) <= 1e-5, (step, k8s, local)
    for t, line in zip(local_timer.at, local_timer.lines):  # where the local launcher's time goes
        if "WARNING" not in line:
            print(f"  local +{t:6.1f}s {line[:120]}")
    print("\n2-rank SFT, %d steps:" % STEPS)
    for where, t in TIMINGS.items():
        print(f"  {where:24s} submission->first step {t['first_step_s']:.1f}s, whole stage {t['total_s']:.1f}s")
    (workspace / "straight-losses.json").write_text(json.dumps(k8s))


def test_an_evicted_rank_fails_the_attempt_and_the_retry_resumes_from_the_store(k8s_cluster, workspace):
    k8s_cluster.create_namespace(NS)
    evicted: list[str] = []

    def on_line(line: str) -> None:
        if not evicted and "checkpoint step 3 synced" in line:
            pods = ClusterApi(k8s_cluster.api_client).list_pods(
                NS, "temper.dev/job=sft-evicted,batch.kubernetes.io/job-completion-index=1")
            evicted.append(pods[0].metadata.name)
            threading.Thread(target=k8s_cluster.evict, args=(NS, pods[0].metadata.name, 2)).start()

    job, timer = run_on_cluster(k8s_cluster, workspace, "evicted", on_line)
    logs = "\n".join(timer.lines)
    assert evicted and job == "sft-evicted-r1", logs[-3000:]
    assert "attempt 0 failed" in logs and "retrying as sft-evicted-r1" in logs
    assert re.search(r"\[sft-evicted-r1-0-\w+\] .*resuming from .*checkpoint-(3|6|9)", logs), logs[-3000:]
    resumed = {**rank0_metrics(k8s_cluster, "sft-evicted"), **rank0_metrics(k8s_cluster, "sft-evicted-r1")}
    straight_file = workspace / "straight-losses.json"
    if not straight_file.exists():  # this test alone: the uninterrupted run first
        run_on_cluster(k8s_cluster, workspace, "reference")
        straight_file.write_text(json.dumps(rank0_metrics(k8s_cluster, "sft-reference")))
    straight = {int(s): v for s, v in json.loads(straight_file.read_text()).items()}
    assert sorted(resumed) == sorted(straight) == list(range(1, STEPS + 1))
    for step, loss in straight.items():
        assert abs(resumed[step] - loss) <= 1e-5, (step, straight, resumed)
    # a loaded 2-core machine (the whole suite at once) took over 30 s for TTL + garbage collection
    k8s_cluster.wait_for("namespace empty (TTL + GC)", lambda: k8s_cluster.leftovers(NS) == {}, timeout=120)
    assert k8s_cluster.processes() == 0


def test_a_job_that_never_fits_fails_with_the_reason_and_leaves_nothing(k8s_cluster, workspace):
    k8s_cluster.create_namespace(NS)
    spec = k8s_spec(workspace, "too-big").model_copy(update={"resources": Resources(cpu="64", memory="1Ti")})
    opts = options(29500).model_copy(update={"unschedulable_after_s": 2.0})
    with pytest.raises(JobFailed) as e:
        KubernetesLauncher(ClusterApi(k8s_cluster.api_client), opts).run(spec, on_log=lambda _: None)
    message = str(e.value)
    assert "\n" not in message and "sft-too-big" in message and "Unschedulable" in message
    assert "Insufficient cpu" in message and "Insufficient memory" in message, message
    k8s_cluster.wait_for("namespace empty", lambda: k8s_cluster.leftovers(NS) == {}, timeout=15)
