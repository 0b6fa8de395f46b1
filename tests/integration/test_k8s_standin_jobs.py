"""Job semantics on the stand-in cluster, with the manifests temper renders and small shell ranks.

Each Job here is ``infra.k8s.manifests.training_job`` (Indexed, podFailurePolicy, headless-Service
DNS) with the container's command swapped for a short script, so the Job controller, scheduler,
kubelet and fault injection are exercised in seconds; the real training run is in
test_flow_post_training_k8s.py (through the flow).
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.jobspec import JobSpec, Resources
from infra.k8s import manifests as m
from infra.k8s.api import ClusterApi
from infra.k8s.errors import JobFailed, KubernetesError
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.options import KubernetesOptions
from temper.core.settings import JobSettings

NS = "temper"
OPTS = KubernetesOptions(namespace=NS, priority_class=None, sandbox_priority_class=None, s3_secret=None,
                         poll_interval_s=0.2, ttl_seconds_after_finished=10, rendezvous_port=29555)


def spec(name: str, **over) -> JobSpec:
    base = dict(name=name, kind="train", command=["python", "-c", "pass"], nodes=2, distributed=True,
                resources=Resources(cpu="500m", memory="256Mi", shm_size="64Mi"), timeout_s=60)
    return JobSpec(**{**base, **over})


def job_with(name: str, script: str, ttl_s: int = 5, **spec_over) -> list:
    """The objects one attempt submits, each rank running ``sh -c script`` instead of accelerate."""
    objs = m.objects_for(spec(name, **spec_over), OPTS)
    job = objs[-1]
    job.spec.ttl_seconds_after_finished = ttl_s
    container = job.spec.template.spec.containers[0]
    container.args = ["sh", "-c", script]
    job.spec.template.spec.termination_grace_period_seconds = 1
    return objs


def launcher(cluster) -> KubernetesLauncher:
    return KubernetesLauncher(ClusterApi(cluster.api_client), OPTS)


def pods_of(cluster, job: str) -> list[k.V1Pod]:
    return ClusterApi(cluster.api_client).list_pods(NS, f"{m.JOB_LABEL}={job}")


def test_indexed_ranks_get_their_index_env_and_resolve_each_other(k8s_cluster):
    k8s_cluster.create_namespace(NS)
    script = ('echo "rank=$NODE_RANK index=$JOB_COMPLETION_INDEX host=$(hostname) master=$MASTER_ADDR"; '
              # a rank's record is there while its pod runs (as in cluster DNS): each looks its peers up until they
              # are all there, as ranks do at rendezvous, and stays up a while for the later one to see it too
              'for i in $(seq 100); do getent hosts "$MASTER_ADDR" ranks-0.ranks ranks-1.ranks '
              '"$(hostname).ranks.temper.svc.cluster.local" >/dev/null && echo resolved && sleep 5 && exit 0; '
              'sleep 0.2; done; exit 2')
    lines: list[str] = []
    start = time.monotonic()
    attempt = launcher(k8s_cluster).submit(job_with("ranks", script), lines.append)
    launcher(k8s_cluster).watch(attempt, lines.append)
    print(f"\nstand-in overhead: 2-pod Job of `sh` ranks, submit -> Complete seen by the launcher: "
          f"{time.monotonic() - start:.2f}s (launcher poll {OPTS.poll_interval_s}s)")
    for i in (0, 1):
        assert any(f"rank={i} index={i} host=ranks-{i} master=ranks-0.ranks" in line for line in lines), lines
    assert sum("resolved" in line for line in lines) == 2, lines
    k8s_cluster.wait_for("TTL deletes the Job and GC its pods", lambda: k8s_cluster.leftovers(NS) == {})


def test_resubmitting_adopts_the_running_job(k8s_cluster):
    k8s_cluster.create_namespace(NS)
    objs = job_with("adopt", "sleep 2")
    first = launcher(k8s_cluster).submit(objs, lambda _: None)
    again = launcher(k8s_cluster).submit(job_with("adopt", "sleep 2"), lambda _: None)
    assert first.adopted == [] and again.adopted == ["adopt", "adopt"]  # Service and Job
    launcher(k8s_cluster).watch(again, lambda _: None)


def test_one_rank_failing_fails_the_job_by_pod_failure_policy(k8s_cluster):
    k8s_cluster.create_namespace(NS)
    attempt = launcher(k8s_cluster).submit(job_with("crash", "sleep 60", ttl_s=300), lambda _: None)
    k8s_cluster.wait_for("both ranks running", lambda: sum(p.status.phase == "Running" for p in pods_of(k8s_cluster, "crash")) == 2)
    rank1 = next(p.metadata.name for p in pods_of(k8s_cluster, "crash") if p.metadata.annotations[
        "batch.kubernetes.io/job-completion-index"] == "1")
    k8s_cluster.kill(NS, rank1)
    with pytest.raises(JobFailed) as e:
        launcher(k8s_cluster).watch(attempt, lambda _: None)
    assert e.value.retriable and e.value.pod == rank1 and "exited with code 137" in str(e.value)
    job = k.BatchV1Api(k8s_cluster.api_client).read_namespaced_job("crash", NS)
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed.reason == "PodFailurePolicy" and "exit code 137 matching FailJob rule at index 1" in failed.message
    k8s_cluster.wait_for("rank 0 stopped by the Job's failure", lambda: k8s_cluster.processes() == 0, timeout=15)


def test_an_evicted_rank_is_ignored_and_its_index_recreated(k8s_cluster):
    k8s_cluster.create_namespace(NS)
    marker = k8s_cluster.shared_dir / "go"
    script = f'while [ ! -e {marker} ]; do sleep 0.1; done'
    attempt = launcher(k8s_cluster).submit(job_with("evict", script), lambda _: None)
    k8s_cluster.wait_for("both ranks running", lambda: sum(p.status.phase == "Running" for p in pods_of(k8s_cluster, "evict")) == 2)
    victim = pods_of(k8s_cluster, "evict")[1]
    k8s_cluster.evict(NS, victim.metadata.name)
    replacement = k8s_cluster.wait_for("index 1 recreated", lambda: [
        p for p in pods_of(k8s_cluster, "evict") if p.metadata.name not in ("", victim.metadata.name)
        and p.metadata.annotations["batch.kubernetes.io/job-completion-index"] == victim.metadata.annotations[
            "batch.kubernetes.io/job-completion-index"] and p.status.phase == "Running"], timeout=15)
    assert replacement[0].spec.hostname == victim.spec.hostname
    marker.touch()
    launcher(k8s_cluster).watch(attempt, lambda _: None)
    job = k.BatchV1Api(k8s_cluster.api_client).read_namespaced_job("evict", NS)
    assert (job.status.succeeded, job.status.failed) == (2, None)  # the disruption was not counted


def test_deadline_suspend_and_delayed_scheduling(k8s_cluster):
    k8s_cluster.create_namespace(NS)
    objs = job_with("slow", "sleep 60")
    objs[-1].spec.active_deadline_seconds = 2
    with pytest.raises(JobFailed) as e:
        attempt = launcher(k8s_cluster).submit(objs, lambda _: None)
        launcher(k8s_cluster).watch(attempt, lambda _: None)
    assert e.value.reason == "DeadlineExceeded" and not e.value.retriable

    batch = k.BatchV1Api(k8s_cluster.api_client)
    held = job_with("held", "true")
    held[-1].spec.suspend = True
    attempt = launcher(k8s_cluster).submit(held, lambda _: None)
    time.sleep(1)
    assert pods_of(k8s_cluster, "held") == []
    assert any(c.type == "Suspended" for c in batch.read_namespaced_job("held", NS).status.conditions)
    k8s_cluster.hold_scheduling(2)
    start = time.monotonic()
    batch.patch_namespaced_job("held", NS, {"spec": {"suspend": False}})
    launcher(k8s_cluster).watch(attempt, lambda _: None)
    assert time.monotonic() - start >= 2  # nothing ran before the scheduler bound the pods


def test_bad_input_fails_in_one_line_naming_the_object_and_leaves_nothing(k8s_cluster):
    with pytest.raises(KubernetesError) as e:  # the namespace does not exist
        launcher(k8s_cluster).run(spec("nowhere"), on_log=lambda _: None)
    assert "\n" not in str(e.value) and str(e.value).startswith("namespace 'temper': not found")

    k8s_cluster.create_namespace(NS)
    k.CoreV1Api(k8s_cluster.api_client).create_namespaced_resource_quota(NS, k.V1ResourceQuota(
        metadata=k.V1ObjectMeta(name="small"), spec=k.V1ResourceQuotaSpec(hard={"requests.cpu": "100m"})))
    with pytest.raises(ApiException) as e:  # a pod the quota can never admit
        ClusterApi(k8s_cluster.api_client).create(k.V1Pod(metadata=k.V1ObjectMeta(name="big", namespace=NS),
                                                          spec=m.sandbox_pod_spec("big", ["true"], OPTS, 60)))
    assert e.value.status == 403 and "exceeded quota: small" in e.value.body

    k.CoreV1Api(k8s_cluster.api_client).create_namespaced_resource_quota(NS, k.V1ResourceQuota(
        metadata=k.V1ObjectMeta(name="no-jobs"), spec=k.V1ResourceQuotaSpec(hard={"count/jobs.batch": "0"})))
    lines: list[str] = []
    with pytest.raises(KubernetesError) as e:  # the Service is created, then the Job is refused
        launcher(k8s_cluster).run(spec("refused"), on_log=lines.append)
    assert "\n" not in str(e.value) and str(e.value).startswith("Job temper/refused: refused by a ResourceQuota") and "exceeded quota: no-jobs" in str(e.value)
    assert "created Service temper/refused" in lines and "deleted Service temper/refused" in lines
    assert k8s_cluster.leftovers(NS) == {}  # what the attempt created is gone

    unreachable = KubernetesLauncher(ClusterApi(k.ApiClient(k.Configuration(host="http://127.0.0.1:9"))), OPTS)
    with pytest.raises(KubernetesError) as e:
        unreachable.run(spec("offline"), on_log=lambda _: None)
    assert "\n" not in str(e.value) and "127.0.0.1:9" in str(e.value)
    assert k8s_cluster.leftovers(NS) == {}


def _objects(cluster, kinds=("Job", "Pod", "Service")) -> dict[str, list[str]]:
    """What is left, through the API, once the garbage collector had its time (Background deletion)."""
    try:
        cluster.wait_for("nothing left", lambda: not {k_: v for k_, v in cluster.leftovers(NS).items() if k_ in kinds})
    except TimeoutError:
        pass
    return {k_: v for k_, v in cluster.leftovers(NS).items() if k_ in kinds}


def test_pods_the_job_controller_cannot_create_fail_the_launcher_at_once(k8s_cluster):
    """The Job is admitted but its pods are not (no such service account; a pod-count quota below the
    gang): the controller only records FailedCreate Events and retries until activeDeadlineSeconds, so the
    launcher reads them and fails in one line naming the Job and the Event, deleting the Job and Service."""
    k8s_cluster.create_namespace(NS)
    no_sa = OPTS.model_copy(update={"service_account": "nobody"})
    lines: list[str] = []
    start = time.monotonic()
    with pytest.raises(JobFailed) as e:  # spec timeout_s=60: the deadline the Job would otherwise wait for
        KubernetesLauncher(ClusterApi(k8s_cluster.api_client), no_sa).run(spec("no-sa"), on_log=lines.append)
    line = str(e.value)
    assert time.monotonic() - start < 10, line
    assert e.value.reason == "FailedCreate" and not e.value.retriable and "\n" not in line
    assert line.startswith("job 'no-sa': FailedCreate:") and 'serviceaccount "nobody" not found' in line, line
    assert "deleted Job temper/no-sa" in lines and "deleted Service temper/no-sa" in lines
    assert _objects(k8s_cluster) == {}

    # one rank's pod is created, the other never is: a pod-count quota of 1 for a 2-rank gang
    k.CoreV1Api(k8s_cluster.api_client).create_namespaced_resource_quota(NS, k.V1ResourceQuota(
        metadata=k.V1ObjectMeta(name="pod-count"), spec=k.V1ResourceQuotaSpec(hard={"pods": "1"})))
    start = time.monotonic()
    with pytest.raises(JobFailed) as e:
        launcher(k8s_cluster).run(spec("one-pod"), on_log=lambda _: None)
    line = str(e.value)
    assert time.monotonic() - start < 10, line
    assert line.startswith("job 'one-pod': FailedCreate:") and "exceeded quota: pod-count" in line, line
    assert "ResourceQuota temper/pod-count: allows pods=1 in total, but job 'one-pod' needs 2" in line
    assert _objects(k8s_cluster) == {}  # the Job, its one pod (by cascade) and the Service
    assert k8s_cluster.processes() == 0


@pytest.mark.parametrize("end", ["exits", "fails", "killed"])
def test_no_sandbox_pod_outlives_the_job_that_made_it(k8s_cluster, end):
    """Sandbox pods carry their job's name (``OWNER_LABEL``, from the job pods' settings, job.sandbox_owner); however the
    job ends, the launcher deletes those it left, and only those. A killed eval pod used to leave its sandbox pods
    running until their deadline (an hour): nothing in the pod could delete them."""
    import threading

    opts = OPTS.model_copy(update={"sandbox_namespace": "temper-sandbox"})
    k8s_cluster.create_namespace(NS)
    k8s_cluster.create_namespace(opts.sandbox_ns)
    api = ClusterApi(k8s_cluster.api_client)
    job = f"owner-{end}"
    # what the job's pod would have made through KubernetesBackend (its owner label), and another job's box
    for name, owner in ((f"sandbox-{end}-0", job), (f"sandbox-{end}-1", job), (f"sandbox-{end}-x", "another-job")):
        api.create(m.sandbox_pod(name, opts, 600, owner=owner))
    script = {"exits": "exit 0", "fails": "exit 3", "killed": "sleep 60"}[end]
    run = spec(job, kind="train", nodes=1, distributed=False, retries=0, command=["sh", "-c", script])
    env = {e.name: e.value for e in m.objects_for(run, opts)[-1].spec.template.spec.containers[0].env}
    assert JobSettings.model_validate_json(env["TEMPER_JOB"]).sandbox_owner == job  # what the pool's backend labels boxes with
    if end == "killed":
        def kill_when_running():
            k8s_cluster.wait_for("the job's pod running", lambda: any(p.status.phase == "Running"
                                                                      for p in pods_of(k8s_cluster, job)))
            k8s_cluster.kill(NS, pods_of(k8s_cluster, job)[0].metadata.name)
        threading.Thread(target=kill_when_running, daemon=True).start()
    lines: list[str] = []
    run_it = lambda: KubernetesLauncher(api, opts).run(run, lines.append)  # noqa: E731
    if end == "exits":
        run_it()
    else:
        with pytest.raises(JobFailed):
            run_it()
    left = {p.metadata.name for p in api.list_pods(opts.sandbox_ns, f"{m.ROLE_LABEL}={m.SANDBOX_ROLE}")}
    assert left == {f"sandbox-{end}-x"}, left
    assert f"deleted 2 sandbox pod(s) job {job} left in {opts.sandbox_ns}" in lines, lines[-5:]
