"""post_training with ``backend: kubernetes`` on the stand-in cluster (tests/k8s_standin), with a real Prefect
server (Prefect's test harness), a real MLflow server and moto's S3 server.

The main test starts the cluster run as an operator does: `prefect deploy` of prefect.yaml's post-training-k8s
on a ``kubernetes`` work pool whose base job template is k8s/prefect/base-job-template.json, and a run of it
that the real Prefect kubernetes worker (prefect-kubernetes, its own process) turns into the flow-run Job; the
stand-in's kubelet runs that pod, whose flow submits the training and eval Jobs below.

The flow's tasks submit through the real client to the stand-in API server: the 2-rank ZeRO-3 SFT
and GRPO as an Indexed Job + headless Service (two pods that rendezvous through the Service's
DNS), eval as sharded Jobs, everything the pods read or write through S3. Rank 1 of the SFT Job is
evicted once, after the first checkpoint is in S3: the launcher's retry Job resumes from it. GRPO's
mix has python_functions, whose code_tests reward runs in sandbox pods the training pods make. The
registered version's per-domain results must equal a local run's with the same seed, and every loss
the flow logged to MLflow (SFT across both attempts, GRPO) the local run's within 1e-5. The local run goes
first: the cluster run reuses its base-model evals from the shared store and evaluates only its candidate.
Bad input fails the first task that needs the cluster with one line and leaves nothing behind (asserted
through the API).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from kubernetes import client as k

from temper.core.tag_names import EVAL_TAG, PARENT_TAG

pytestmark = pytest.mark.slow

# generated into the moto bucket by flow_env (s3_env first); python_functions is verified in sandboxes
FLOW_DOMAINS = ("arithmetic", "multiplication", "python_functions")
NS, SANDBOX_NS = "temper", "temper-sandbox"


def _params(backend: str, **kw):
    from temper.lifecycle.params import EvalSettings, GRPOSettings, PostTrainingParams, SFTStage

    fields = dict(model_name=f"temper-k8s-{backend}", domains=["arithmetic", "multiplication"], sft=SFTStage(max_steps=20, save_steps=5),
                  grpo=GRPOSettings(max_steps=4), eval=EvalSettings(limit=16, shards=2), backend=backend, seed=0)
    return PostTrainingParams(**{**fields, **kw})


@pytest.fixture
def on_cluster(temper_home, s3_env, flow_env, k8s_cluster, monkeypatch, tmp_path):
    """The stand-in set up as k8s/base would: namespaces, the workloads' account, priority classes, the S3
    Secret (moto's test credentials), and the options file a flow-run pod reads (TEMPER_K8S_OPTIONS)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from infra.k8s.options import KubernetesOptions
    from temper.lifecycle.execution import execution_for
    from temper.training.deepspeed import torch_extensions_dir

    k8s_cluster.create_namespace(NS, service_accounts=("temper-workload",),
                                 priority_classes=("temper-training", "temper-sandbox"))
    k8s_cluster.create_namespace(SANDBOX_NS, service_accounts=())
    k.CoreV1Api(k8s_cluster.api_client).create_namespaced_secret(NS, k.V1Secret(
        metadata=k.V1ObjectMeta(name="temper-s3"),
        string_data={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}))

    # DeepSpeed's CPU comm op, compiled once on this machine, on a volume every pod sees (as an image or a
    # cache volume would carry it): else each pod JIT-compiles it (~1-3 min on 2 busy cores) in its own /tmp.
    cache = k8s_cluster.shared_dir / "torch_extensions"
    built = Path(torch_extensions_dir()) / "deepspeed_shm_comm"
    lock = built / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > 900:  # a killed build's (one takes 1-3 min): torch
        lock.unlink()  # would wait on it forever
    if not (built / "deepspeed_shm_comm.so").exists() or lock.exists():
        # built first (or its build elsewhere waited for, through torch's lock): a copy of no cache or of a build
        # in progress had every cluster run compile it again in its pods, on their way to the first step
        build = ("from temper.training.device import use_interpreters_ninja; use_interpreters_ninja(); "
                 "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()")
        subprocess.run([sys.executable, "-c", build], check=True, capture_output=True, timeout=900,
                       env={**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": torch_extensions_dir()})
    if Path(torch_extensions_dir()).is_dir():
        # not the FileBaton/ninja locks: a copied lock of a build elsewhere would make every pod wait forever
        shutil.copytree(torch_extensions_dir(), cache, ignore=shutil.ignore_patterns("lock", ".ninja_lock"))

    def options(**kw) -> None:
        path = tmp_path / "options.yaml"
        # sandbox boxes sized so the eval pod's warm pool (4 boxes) fits the stand-in's 4-CPU node next to it
        base = dict(sandbox_namespace=SANDBOX_NS, sandbox_cpu="250m", sandbox_memory="512Mi", poll_interval_s=0.5, unschedulable_after_s=15, sandbox_start_timeout_s=60,
                    env={"TORCH_EXTENSIONS_DIR": str(cache)})
        path.write_text(yaml.safe_dump(KubernetesOptions(**{**base, **kw}).model_dump(mode="json")))
        monkeypatch.setenv("TEMPER_K8S_OPTIONS", str(path))
        execution_for.cache_clear()

    options()
    # The stand-in has no in-cluster service-account tokens: pods reach its API through KUBECONFIG (passed on
    # by the execution backend as a path), so the file lives where every pod sees it, not under a pod's /tmp.
    kubeconfig = k8s_cluster.shared_dir / "kubeconfig"
    shutil.copy(k8s_cluster.kubeconfig, kubeconfig)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    k8s_cluster.set_options = options
    yield k8s_cluster
    execution_for.cache_clear()


POOL = "temper-k8s"  # the work pool k8s/base/prefect-worker.yaml polls and prefect.yaml's kubernetes deployments use


@pytest.fixture
def k8s_worker(on_cluster, tmp_path, request):
    """The real Prefect worker of a ``kubernetes`` work pool (prefect-kubernetes, ``prefect worker start --type
    kubernetes``) in its own process, its kube config pointing at the stand-in, polling the session's Prefect
    server; the pool's base job template is k8s/prefect/base-job-template.json, as `prefect work-pool create`
    makes it (docs/kubernetes.md). The cluster holds what k8s/base gives a flow-run pod: the temper-flow-runner
    account and the temper-k8s-options ConfigMap (the options the test set, mounted at /etc/temper).

    A test module's ``WORKER_IMAGE`` runs the worker in that container image instead (podman, host network,
    read-only root, uid 1000, as k8s/base/prefect-worker.yaml runs it; test_worker_image.py).

    Yields ``deploy(name)``: `prefect deploy` of prefect.yaml's deployment ``name`` (the image the stand-in's
    workload image, the flow code at /app, as in the real image), and the worker's log file."""
    import os
    import subprocess
    from pathlib import Path

    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL

    from tests.conftest import REPO
    from tests.integration.conftest import BIN, stop_process

    template = json.loads((REPO / "k8s/prefect/base-job-template.json").read_text())
    _prefect(lambda c: c.create_work_pool(WorkPoolCreate(name=POOL, type="kubernetes", base_job_template=template),
                                          overwrite=True))
    core = k.CoreV1Api(on_cluster.api_client)
    core.create_namespaced_service_account(NS, k.V1ServiceAccount(metadata=k.V1ObjectMeta(name="temper-flow-runner")))
    core.create_namespaced_config_map(NS, k.V1ConfigMap(metadata=k.V1ObjectMeta(name="temper-k8s-options"), data={
        "options.yaml": Path(os.environ["TEMPER_K8S_OPTIONS"]).read_text()}))
    # the flow-run pod (500m) on top of the 4 CPUs the test's training and sandbox pods were sized to fill
    node = core.list_node().items[0].metadata.name
    core.patch_node_status(node, {"status": {"capacity": {"cpu": "5"}, "allocatable": {"cpu": "5"}}})
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "KUBECONFIG": str(on_cluster.kubeconfig),
           # as k8s/base/prefect-worker.yaml: the observer watches this namespace only, no kube-system read
           "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES": NS, "PREFECT_KUBERNETES_CLUSTER_UID": "temper-standin",
           "PREFECT_WORKER_QUERY_SECONDS": "1"}  # poll every second (default 10 s)
    log = tmp_path / "worker.log"
    command = ["prefect", "worker", "start", "--pool", POOL, "--type", "kubernetes", "--install-policy", "never",
               "--name", "standin-worker"]
    image = getattr(request.module, "WORKER_IMAGE", None)
    if image:
        container = f"temper-worker-{os.getpid()}"
        passed = ("PREFECT_API_URL", "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES", "PREFECT_KUBERNETES_CLUSTER_UID",
                  "PREFECT_WORKER_QUERY_SECONDS")
        command = ["podman", "--runtime", "runc", "run", "--rm", "--name", container, "--network", "host", "--read-only",
                   "--user", "1000:1000", "--tmpfs", "/home/prefect:rw,size=256m", "--tmpfs", "/tmp:rw,size=256m",
                   "-v", f"{on_cluster.kubeconfig}:/etc/kube/config:ro", "-e", "KUBECONFIG=/etc/kube/config",
                   *[a for var in passed for a in ("-e", f"{var}={env[var]}")], image(), *command]
        env.setdefault("CONTAINERS_CONF", str(REPO / "docker" / "containers.conf"))
    else:
        command[0] = str(BIN / "prefect")
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def deploy(name: str, **env_vars: str) -> None:
        out = subprocess.run([str(BIN / "prefect"), "--no-prompt", "deploy", "--prefect-file", str(REPO / "prefect.yaml"),
                              "--name", name], cwd=REPO, capture_output=True, text=True, timeout=300,
                             env={**env, "TEMPER_IMAGE": "temper-workload:latest", "TEMPER_CODE_DIR": "/app", **env_vars})
        assert out.returncode == 0, out.stdout + out.stderr

    try:
        yield deploy, log
    finally:
        # 2 s, not 15: on SIGTERM the worker relays SIGINT to its worker process, which does not exit (its log:
        # "Received SIGTERM. Sending SIGINT to the kubernetes worker"), so the grace was always waited out in full
        stop_process(proc, grace_s=2)
        if image:
            subprocess.run(["podman", "--runtime", "runc", "rm", "-f", "--ignore", container], env=env, capture_output=True)
        print(f"worker log: {log}")


def _prefect(coro_fn):
    from prefect.client.orchestration import get_client

    async def go():
        async with get_client() as client:
            return await coro_fn(client)

    return asyncio.run(go())


def _stage_timing(flow_run_id, task_name: str) -> tuple[float, float]:
    """(task start -> first training step logged, task start -> end) in seconds, from Prefect's own records."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId

    runs = _prefect(lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))))
    (run,) = [r for r in runs if r.name == task_name]
    logs = _prefect(lambda c: c.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[run.id]))))
    first = min(log.timestamp for log in logs if " step 1/" in log.message)
    return (first - run.start_time).total_seconds(), (run.end_time - run.start_time).total_seconds()


INDEX = "batch.kubernetes.io/job-completion-index"


class EvictAfterFirstCheckpoint(threading.Thread):
    """Watches the cluster as an operator would: follows rank 0's log of the ``stage`` Job and, as soon as it
    logs its first checkpoint synced to the store, evicts rank 1's pod (the policy/v1 Eviction), once.

    Following the log stream, not polling it: an SFT step takes ~0.2 s here, so after the first checkpoint
    (step 5 of 20) the eviction has ~3 s to land before the run is over."""

    def __init__(self, cluster, stage: str) -> None:
        super().__init__(name=f"evict-{stage}", daemon=True)
        self.cluster, self.stage = cluster, stage
        self.core = k.CoreV1Api(cluster.api_client)
        self.done, self.evicted, self.after = threading.Event(), None, ""

    def _pods(self, index: int, job: str | None = None) -> list:
        return [p for p in self.core.list_namespaced_pod(NS, label_selector=f"{INDEX}={index}").items
                if (p.metadata.labels.get("temper.dev/job") == job if job else
                    p.metadata.labels.get("temper.dev/job", "").startswith(f"{self.stage}-"))
                and p.status.phase == "Running"]

    def run(self) -> None:
        from infra.k8s.api import ClusterApi

        while not self.done.wait(0.25):
            rank0 = self._pods(0)
            if not rank0:
                continue
            job = rank0[0].metadata.labels["temper.dev/job"]
            # read to the end (rank 0 dies of the lost peer soon): a stream dropped mid-write is an error on the server
            for line in ClusterApi(self.cluster.api_client).stream_log(NS, rank0[0].metadata.name, "main"):
                if self.after or "temper: checkpoint step" not in line or " synced to s3://" not in line:
                    continue
                self.after = line
                rank1 = self._pods(1, job)
                if rank1:
                    self.evicted = rank1[0].metadata.name
                    self.cluster.evict(NS, self.evicted, 1)
            return  # once: rank 0 ended (without a checkpoint, nothing was evicted: the test says so)


def stage_losses(lifecycle_run_id: str, stage: str) -> dict[int, float]:
    return stage_metric(lifecycle_run_id, stage, "loss")


def stage_metric(lifecycle_run_id: str, stage: str, key: str) -> dict[int, float]:
    """The ``loss`` history of a flow run's stage, as the flow logged it to MLflow: every stage run under the
    lifecycle run (a retry Job starts a new one: its pod has no emptyDir of the first), later attempts last."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, filter_string=f"tags.`{PARENT_TAG}` = '{lifecycle_run_id}'")
    runs = sorted((r for r in runs if r.info.run_name.startswith(f"{stage}-")), key=lambda r: r.info.start_time)
    losses: dict[int, float] = {}
    for run in runs:
        losses.update({m.step: m.value for m in client.get_metric_history(run.info.run_id, key)})
    return losses


def _grpo_sandboxed():
    from temper.lifecycle.params import EvalSettings

    # python_functions (code_tests) in the training mix: GRPO's reward function in each training pod makes sandbox
    # pods in temper-sandbox through KubernetesBackend. The eval suite stays the two in-process domains: the
    # sandbox-verified eval is its own test below (queued code_tests records can time out there, see its comment)
    return dict(domains=["arithmetic", "multiplication", "python_functions"],
                eval=EvalSettings(limit=16, shards=2, domains=["arithmetic", "multiplication"]))


GRPO_SANDBOXED = _grpo_sandboxed()


def run_on_the_worker(cluster, deploy, params) -> tuple:
    """The cluster side of a run as an operator starts it: `prefect deploy` of prefect.yaml's post-training-k8s,
    a run of that deployment, which the kubernetes worker turns into a flow-run Job from the pool's base job
    template; the stand-in's kubelet runs that pod (`prefect flow-run execute` in the workload image), whose
    flow submits its training and eval Jobs to the same cluster. Returns (flow run, its Job, seconds to deploy).

    Per run (job variables, as `prefect deployment run --job-variable` gives them): the test's MLflow and S3
    endpoints, the stand-in's kubeconfig (it has no in-cluster tokens), and result storage on the shared disk
    so this process reads the flow's return value (a real cluster would use an S3 result storage)."""
    import os

    from prefect.deployments import run_deployment

    t = time.perf_counter()
    deploy("post-training-k8s", TEMPER_STORAGE_ROOT=os.environ["TEMPER_STORAGE_ROOT"])
    deployed = time.perf_counter() - t
    env = {"TEMPER_TRACKING_URI": os.environ["TEMPER_TRACKING_URI"], "TEMPER_S3_ENDPOINT_URL": os.environ["TEMPER_S3_ENDPOINT_URL"],
           "KUBECONFIG": os.environ["KUBECONFIG"], "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(cluster.shared_dir / "prefect-results")}
    run = run_deployment("post_training/post-training-k8s", parameters={"params": params.model_dump(mode="json")},
                         job_variables={"env": env}, timeout=1500, poll_interval=2)
    batch = k.BatchV1Api(cluster.api_client)
    (job,) = batch.list_namespaced_job(NS, label_selector=f"prefect.io/flow-run-id={run.id}").items
    # the flow reported Completed from inside the pod; the pod's process ends just after
    cluster.wait_for("the flow-run Job succeeded", lambda: batch.read_namespaced_job(job.metadata.name, NS).status.succeeded,
                     timeout=120)
    return run, batch.read_namespaced_job(job.metadata.name, NS), deployed


@pytest.mark.timeout(1800)  # two whole post_training runs (~5 min each on 2 shared cores)
def test_post_training_on_the_cluster_equals_the_local_run(on_cluster, k8s_worker):
    from mlflow.tracking import MlflowClient

    from flows.post_training import post_training

    deploy, worker_log = k8s_worker
    # The local run first: it computes the base model's evals and keeps them in the store both runs share; the
    # cluster run then reuses them (as any later run on the same data does), so it runs only the candidate's
    # eval Jobs. That the two backends score alike is proven by the candidates' evals, run on both.
    t = time.perf_counter()
    local_state = post_training(_params("local", **GRPO_SANDBOXED), return_state=True)
    local_wall = time.perf_counter() - t
    assert local_state.is_completed(), local_state.message
    local = local_state.result()

    evictor = EvictAfterFirstCheckpoint(on_cluster, "sft")
    evictor.start()
    t = time.perf_counter()
    try:
        run, flow_job, deploy_s = run_on_the_worker(on_cluster, deploy, _params("kubernetes", **GRPO_SANDBOXED))
    finally:
        evictor.done.set()
    k8s_wall = time.perf_counter() - t
    state = run.state
    assert state.is_completed(), (state.message, worker_log.read_text()[-3000:])
    remote = state.result()
    check_flow_run_job(on_cluster, run, flow_job)

    # the same per-domain results after training (same seed, same 2-rank ZeRO-3); before: the local run's, reused
    assert remote["after"] == local["after"] and remote["before"] == local["before"], (remote, local)
    computed, reused = _base_evals(local["lifecycle_run_id"]), _base_evals(remote["lifecycle_run_id"])
    assert set(computed) == set(reused) == set(remote["before"]) and all(src is None for _, src in computed.values())
    assert {d: src for d, (_, src) in reused.items()} == {d: run for d, (run, _) in computed.items()}
    mv = MlflowClient().get_model_version("temper-k8s-kubernetes", remote["registered"]["version"])
    for domain, mean in remote["after"].items():
        assert float(mv.tags[EVAL_TAG.format(domain=domain, metric="mean_reward")]) == pytest.approx(mean)

    batch, core = k.BatchV1Api(on_cluster.api_client), k.CoreV1Api(on_cluster.api_client)
    jobs = {j.metadata.name: j for j in batch.list_namespaced_job(NS).items}
    train = sorted(n for n, j in jobs.items() if j.metadata.labels.get("temper.dev/kind") == "train")
    evals = [j for j in jobs.values() if j.metadata.labels.get("temper.dev/kind") == "eval"]
    # SFT: the evicted attempt (rank 0 lost its peer: the Job failed) and its retry Job; GRPO
    assert evictor.evicted and evictor.evicted.startswith("sft-"), "no SFT rank was evicted"
    sft = next(n for n in train if n.startswith("sft-") and not n.endswith("-r1"))
    assert train == sorted([sft, f"{sft}-r1", next(n for n in train if n.startswith("grpo-"))]), train
    assert jobs[sft].status.failed and not jobs[sft].status.succeeded
    assert all(jobs[n].spec.parallelism == 2 and jobs[n].spec.completion_mode == "Indexed" for n in train)
    assert len(evals) == 2  # 2 shards of the candidate's eval (the base's was the local run's, reused)
    assert all(j.status.succeeded for n, j in jobs.items() if n != sft)
    retry0 = core.list_namespaced_pod(NS, label_selector=f"temper.dev/job={sft}-r1,{INDEX}=0").items[0]
    resumed = [line for line in core.read_namespaced_pod_log(retry0.metadata.name, NS, container="main").splitlines()
               if "resuming from" in line]
    assert resumed and "checkpoint-" in resumed[0], "the retry Job did not resume from the checkpoint"
    print(f"\nevicted {evictor.evicted} after '{evictor.after.strip()}'; the retry: {resumed[0].strip()[-160:]}")
    assert not core.list_namespaced_service(NS).items  # headless Services go with their run
    assert on_cluster.processes() == 0

    # ZeRO-3 across pods: each training pod held a part of the parameters (its emptyDir outlives it on the node)
    for job in train:
        reports = {p.name: json.loads(p.read_text()) for p in (on_cluster.root / "pods").glob(
            f"{NS}_{job}-[01]-*/volumes/*/temper/runs/*/*/shards-rank*.json")}
        assert {"shards-rank0.json", "shards-rank1.json"} <= set(reports), (job, reports)
        assert all(0 < r["local_numel"] < r["full_numel"] for r in reports.values()), (job, reports)

    # GRPO's code_tests rewards ran in sandbox pods made by the training pods (the eval pods made none: no code domain)
    boxes = [p.name for p in (on_cluster.root / "pods").iterdir() if p.name.startswith(f"{SANDBOX_NS}_sandbox-")]
    assert boxes, "no sandbox pod ran for GRPO's code_tests reward"
    for key in ("reward_python_functions", "none_rate_python_functions"):
        remote_m, local_m = (stage_metric(r["lifecycle_run_id"], "grpo", key) for r in (remote, local))
        assert remote_m and remote_m == local_m, (key, remote_m, local_m)
    print(f"GRPO: python_functions rewards from {len(boxes)} sandbox pod(s) equal the local run's (bubblewrap)")

    # the losses the flow logged to MLflow: the interrupted and resumed SFT and GRPO equal the local run's
    for stage, steps in (("sft", 20), ("grpo", 4)):
        remote_losses, local_losses = stage_losses(remote["lifecycle_run_id"], stage), stage_losses(local["lifecycle_run_id"], stage)
        assert sorted(remote_losses) == sorted(local_losses) == list(range(1, steps + 1)), (stage, remote_losses, local_losses)
        worst = max(abs(remote_losses[s] - local_losses[s]) for s in local_losses)
        assert worst <= 1e-5, (stage, remote_losses, local_losses)
        print(f"{stage}: {steps} losses, largest difference kubernetes vs local {worst:.2e}")

    for stage in ("train-sft", "train-grpo"):
        k8s_first, k8s_stage = _stage_timing(run.id, stage)
        loc_first, loc_stage = _stage_timing(local_state.state_details.flow_run_id, stage)
        print(f"{stage}: submission->first step kubernetes {k8s_first:.1f}s local {loc_first:.1f}s; "
              f"whole stage kubernetes {k8s_stage:.1f}s local {loc_stage:.1f}s"
              + (" (kubernetes: with the eviction and the retry Job)" if stage == "train-sft" else ""))
    print(f"whole flow: kubernetes {k8s_wall:.0f}s (of it `prefect deploy` {deploy_s:.1f}s, run created -> flow started in "
          f"its pod {(run.start_time - run.created).total_seconds():.1f}s) local {local_wall:.0f}s")


def _base_evals(lifecycle_run_id: str) -> dict[str, tuple[str, str | None]]:
    """domain -> (eval run, the eval run whose kept result it reused or None) of a flow run's base-model evals."""
    from temper.core.tag_names import TAG_DOMAIN, TAG_EVAL_LABEL, TAG_EVAL_REUSED_FROM, TAG_STAGE
    from temper.registry.samples import stage_runs

    return {r.data.tags[TAG_DOMAIN]: (r.info.run_id, r.data.tags.get(TAG_EVAL_REUSED_FROM))
            for r in stage_runs(lifecycle_run_id)
            if r.data.tags.get(TAG_STAGE) == "eval" and r.data.tags.get(TAG_EVAL_LABEL) == "base"}


def check_flow_run_job(cluster, run, job) -> None:
    """The flow-run Job is the pool's base job template rendered by the worker, and the worker's observer
    (prefect-kubernetes' kopf watches of this namespace) replicated its pod's phases as Prefect events."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    pod_spec = job.spec.template.spec
    (container,) = pod_spec.containers
    assert job.metadata.labels["prefect.io/flow-run-id"] == str(run.id) and job.spec.backoff_limit == 0
    assert pod_spec.service_account_name == "temper-flow-runner" and container.name == "prefect-job"
    assert container.image == "temper-workload:latest" and container.args[:3] == ["prefect", "flow-run", "execute"]
    assert container.security_context.read_only_root_filesystem and pod_spec.security_context.run_as_non_root
    assert {m.mount_path for m in container.volume_mounts} == {"/tmp", "/etc/temper"}
    env = {e.name: e.value for e in container.env}
    assert env["PREFECT__FLOW_RUN_ID"] == str(run.id) and env["TEMPER_K8S_OPTIONS"] == "/etc/temper/options.yaml"

    def phases() -> set[str]:
        page = _prefect(lambda c: c.read_events(EventFilter(event=EventNameFilter(prefix=["prefect.kubernetes.pod."]),
                                                            related=EventRelatedFilter(id=[f"prefect.flow-run.{run.id}"])), limit=50))
        return {e.event.rsplit(".", 1)[-1] for e in page.events}

    cluster.wait_for("the observer's pod events", lambda: {"running", "succeeded"} <= phases(), timeout=60)
    print(f"flow-run Job {job.metadata.name}: pod events {sorted(phases())}")


@pytest.mark.timeout(900)
def test_sandbox_verified_eval_runs_in_sandbox_pods_and_equals_local(on_cluster):
    """An eval Job whose verifier (code_tests) makes sandbox pods in temper-sandbox from inside the eval pod,
    through KubernetesBackend and the pod's own API access; the per-sample rewards equal bubblewrap's here."""
    from prefect import flow

    from tasks.evaluation import evaluate
    from tasks.training import prepare_base_model
    from temper.lifecycle.params import EvalSettings

    @flow
    def eval_only(backend: str) -> list[dict]:
        model = prepare_base_model("tiny")
        # 2 records: the pool's 2 concurrent boxes take both at once. One exec round trip on the stand-in took
        # seconds, so queued records hit code_tests' deadline (4 x its 5 s limit) and scored None (measured: 2 of 6)
        return evaluate(model, ["python_functions"], EvalSettings(limit=2, max_new_tokens=24), f"sandboxed-{backend}",
                        None, backend)

    remote, local = eval_only("kubernetes"), eval_only("local")
    assert remote == local and remote[0]["n"] == remote[0]["scored"] == 2, (remote, local)
    boxes = [p.name for p in (on_cluster.root / "pods").iterdir() if p.name.startswith(f"{SANDBOX_NS}_sandbox-")]
    assert boxes, "no sandbox pod ran in the sandbox namespace"
    # the eval pod's pool deletes its boxes when the pod's process ends (workloads/evaluate.py: close_shared). This
    # failed intermittently until ClusterApi.exec got its own ApiClient: the client's exec swapped the shared
    # client's transport for a websocket one, and the pool's deletes then failed ("Handshake status 200 OK")
    on_cluster.wait_for("sandbox pods deleted", lambda: not on_cluster.leftovers(SANDBOX_NS), timeout=60)


def _leftovers(cluster) -> dict:
    """What is left in both namespaces once the garbage collector has had its time (Background deletion
    of a Job removes its pods asynchronously, on a real cluster too)."""
    def left():
        return {ns: cluster.leftovers(ns) for ns in (NS, SANDBOX_NS) if cluster.leftovers(ns)}
    try:
        cluster.wait_for("no leftover objects", lambda: not left(), timeout=30)
    except TimeoutError:
        pass
    return left()


def test_an_image_that_cannot_be_pulled_fails_the_first_training_task_and_leaves_nothing(on_cluster):
    from flows.post_training import post_training

    on_cluster.set_options(image="registry.example.com/temper-workload:missing")
    state = post_training(_params("kubernetes", sft={"enabled": True, "max_steps": 2}), return_state=True)
    assert state.is_failed()
    message = state.message or ""
    with pytest.raises(Exception) as e:
        state.result()
    line = str(e.value)
    assert "ImagePullBackOff" in line and "registry.example.com/temper-workload:missing" in line, (message, line)
    assert "\n" not in line.strip()
    assert _leftovers(on_cluster) == {}


@pytest.mark.parametrize("options, words", [
    (dict(namespace="missing"), "namespace 'missing': not found"),
    (dict(service_account="nobody"), "service account temper/nobody: not found"),
    # refused for 3 s is enough here (the fixture's 15 s is for pods that do fit, waiting for a busy node)
    (dict(train_resources={"cpu": "64", "memory": "1Gi", "shm_size": "64Mi"}, unschedulable_after_s=3), "Unschedulable"),
])
def test_bad_cluster_input_is_one_line_and_leaves_nothing(on_cluster, options, words, tmp_path):
    """The first task that needs the cluster, run as the flow runs it (its execution backend)."""
    from temper.lifecycle.execution import execution_for
    from temper.training.config import SFTSettings, TrainConfig

    on_cluster.set_options(**options)
    ex = execution_for("kubernetes")
    cfg = TrainConfig(mode="sft", run_name="pt-bad-sft", base_model="s3://nowhere/model", output_dir=str(tmp_path / "o"),
                      world_size=2, sft=SFTSettings(max_steps=2))
    spec, _ = ex.training_job(cfg, "run")
    with pytest.raises(Exception) as e:
        ex.run(spec, lambda line: None)
    line = str(e.value)
    assert words in line and "\n" not in line, line
    assert _leftovers(on_cluster) == {}
