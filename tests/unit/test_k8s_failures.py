"""Failure mapping: realistic Job/Pod status documents (as the API server returns them, camelCase,
deserialised into the official client's models) -> the reason, pod, retry decision and cleanup
the launcher reports. The documents follow what the kubelet and the Job controller write for
each case (Kubernetes 1.30-1.33); the API layer is the fake of ``ClusterApi`` in
test_k8s_manifests.py, nothing else is faked."""

from __future__ import annotations

import pytest
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.jobspec import JobSpec, Resources
from infra.k8s.api import exec_exit_code
from infra.k8s.errors import JobFailed, KubernetesError
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.outcomes import classify, failed_create
from infra.k8s.options import KubernetesOptions
from tests.unit.test_k8s_manifests import FakeApi

OPTS = KubernetesOptions(poll_interval_s=30, unschedulable_after_s=900)
T0 = "2026-11-02T10:00:00Z"


def _train(**kw) -> JobSpec:
    base = dict(name="sft-abc", kind="train", command=["python", "-m", "workloads.train", "sft"], nodes=2,
                procs_per_node=2, distributed=True, resources=Resources(gpus=2, memory="64Gi"), retries=2,
                timeout_s=7200)
    return JobSpec(**{**base, **kw})


def _eval(**kw) -> JobSpec:
    return JobSpec(**{**dict(name="eval-abc", kind="eval", command=["python", "-m", "workloads.evaluate"],
                             retries=1), **kw})


def container_status(state: dict, last: dict | None = None, restarts: int = 0) -> dict:
    doc = {"name": "main", "image": "registry.example.com/temper-workload:0.1.0",
           "imageID": "registry.example.com/temper-workload@sha256:" + "ab" * 32, "ready": False,
           "restartCount": restarts, "started": False, "state": state}
    if last:
        doc["lastState"] = last
    return doc


def pod(name: str, phase: str, statuses: list[dict] | None = None, conditions: list[dict] | None = None,
        **status) -> dict:
    doc = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "temper", "uid": "7d1c-" + name,
                        "labels": {"temper.dev/job": name.rsplit("-", 2)[0], "batch.kubernetes.io/job-completion-index": "0"}},
           "status": {"phase": phase, "qosClass": "Guaranteed", "startTime": T0, **status}}
    if statuses is not None:
        doc["status"]["containerStatuses"] = statuses
    if conditions is not None:
        doc["status"]["conditions"] = conditions
    return doc


def job_failed(reason: str, message: str, failed: int = 1) -> dict:
    cond = {"lastProbeTime": T0, "lastTransitionTime": T0, "message": message, "reason": reason, "status": "True"}
    return {"startTime": T0, "failed": failed, "terminating": 0, "ready": 0, "uncountedTerminatedPods": {},
            "conditions": [{**cond, "type": "FailureTarget"}, {**cond, "type": "Failed"}]}


EVICTED_POD = pod(
    "eval-abc-0-qk2vx", "Failed", reason="Evicted",
    message="The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 8123456Ki. "
            "Container main was using 2Gi, request is 0, has larger consumption of ephemeral-storage. ",
    statuses=[container_status({"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                               "message": "The container could not be located when the pod was terminated",
                                               "startedAt": None, "finishedAt": None}})],
    conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                 "message": "The node was low on resource: ephemeral-storage.", "lastTransitionTime": T0},
                {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": T0}])

UNSCHEDULABLE_POD = pod(
    "sft-abc-0-x7p2q", "Pending",
    conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
                 "lastTransitionTime": T0,
                 "message": "0/6 nodes are available: 2 node(s) had untolerated taint {node-role.kubernetes.io/"
                            "control-plane: }, 4 Insufficient nvidia.com/gpu. preemption: 0/6 nodes are available: "
                            "2 Preemption is not helpful for scheduling, 4 No preemption victims found for incoming pod."}])

OOM_POD = pod("sft-abc-1-m4c8d", "Failed", statuses=[container_status(
    {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": T0, "finishedAt": T0,
                    "containerID": "containerd://9f0c"}})])


def _launcher(api, opts=OPTS):
    """A launcher on a fake clock: sleeping advances time instead of waiting."""
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
    return KubernetesLauncher(api, opts, clock=lambda: now[0], sleep=sleep), now


def test_evicted_shard_is_retriable_and_names_the_pod():
    api = FakeApi(job_failed("BackoffLimitExceeded", "Job has reached the specified backoff limit", failed=2),
                  pods=[EVICTED_POD])
    launcher, _ = _launcher(api)
    with pytest.raises(JobFailed) as e:
        launcher.run(_eval(), lambda s: None)
    assert (e.value.reason, e.value.pod, e.value.retriable) == ("Evicted", "eval-abc-0-qk2vx", True)
    assert "ephemeral-storage" in str(e.value)
    assert ("Job", "eval-abc") not in api.deleted  # a finished Job stays for its logs (TTL deletes it)


def test_eviction_of_a_rank_is_ignored_by_the_gang_job_policy():
    """A training Job never fails on an eviction: the kubelet's DisruptionTarget condition on the
    evicted pod matches the Job's Ignore rule, which comes before the FailJob rule its exit code
    137 would also match (the first matching rule wins), so Kubernetes recreates that index."""
    from infra.k8s import manifests as m

    rules = m.training_job(_train(), OPTS).spec.pod_failure_policy.rules
    conditions = {(c["type"], c["status"]) for c in EVICTED_POD["status"]["conditions"]}
    exit_code = EVICTED_POD["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]

    def matches(rule) -> bool:
        if rule.on_pod_conditions:
            return any((pat.type, pat.status) in conditions for pat in rule.on_pod_conditions)
        req = rule.on_exit_codes
        return req.container_name == m.MAIN_CONTAINER and (exit_code in req.values) == (req.operator == "In")
    assert next(r for r in rules if matches(r)).action == "Ignore"
    assert [r.action for r in rules if matches(r)] == ["Ignore", "FailJob"]


def test_oom_outranks_eviction_in_the_same_job():
    api = FakeApi(job_failed("PodFailurePolicy", "Container main for pod temper/sft-abc-1-m4c8d failed with exit "
                             "code 137 matching FailJob rule at index 1"), pods=[EVICTED_POD, OOM_POD])
    launcher, _ = _launcher(api)
    with pytest.raises(JobFailed) as e:
        launcher.run(_train(), lambda s: None)
    assert (e.value.reason, e.value.pod, e.value.retriable) == ("OOMKilled", "sft-abc-1-m4c8d", False)
    assert "memory=64Gi" in str(e.value) and "sft-abc-r1" not in api.created


def test_deadline_exceeded_is_final_and_keeps_the_job():
    running = pod("sft-abc-0-x7p2q", "Failed", statuses=[container_status(
        {"terminated": {"exitCode": 143, "reason": "Error", "startedAt": T0, "finishedAt": T0}})])
    api = FakeApi(job_failed("DeadlineExceeded", "Job was active longer than specified deadline", failed=2),
                  pods=[running])
    launcher, _ = _launcher(api)
    logs: list[str] = []
    with pytest.raises(JobFailed) as e:
        launcher.run(_train(), logs.append)
    assert e.value.reason == "DeadlineExceeded" and not e.value.retriable
    assert "activeDeadlineSeconds=7200" in str(e.value)
    assert "sft-abc-r1" not in api.created  # a longer run is a config change, not a retry
    assert ("Job", "sft-abc") not in api.deleted and ("Service", "sft-abc") in api.deleted


def test_a_job_deleted_while_watched_fails_as_deleted_naming_the_ttl_not_a_client_traceback():
    class Vanishing(FakeApi):
        def read_job(self, ns, name):
            raise ApiException(status=404, reason="Not Found")
    api = Vanishing({"active": 1}, pods=[])
    launcher, _ = _launcher(api, OPTS.model_copy(update={"ttl_seconds_after_finished": 1}))
    with pytest.raises(JobFailed) as e:
        launcher.run(_train(), lambda s: None)
    assert e.value.reason == "Deleted" and not e.value.retriable and "sft-abc-r1" not in api.created
    assert "was deleted while temper watched it" in str(e.value) and "ttlSecondsAfterFinished=1" in str(e.value)


def test_unschedulable_fails_after_the_grace_period_and_deletes_the_job():
    api = FakeApi({"active": 2, "startTime": T0, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {}},
                  pods=[UNSCHEDULABLE_POD])
    launcher, now = _launcher(api)
    with pytest.raises(JobFailed) as e:
        launcher.run(_train(), lambda s: None)
    assert e.value.reason == "Unschedulable" and not e.value.retriable
    assert "Insufficient nvidia.com/gpu" in str(e.value)
    assert OPTS.unschedulable_after_s <= now[0] < OPTS.unschedulable_after_s + 2 * OPTS.poll_interval_s
    assert ("Job", "sft-abc") in api.deleted and ("Service", "sft-abc") in api.deleted


def test_unschedulable_is_not_failed_while_kueue_holds_the_job():
    job = k.V1Job.model_validate({"metadata": {"name": "sft-abc"}, "spec": {
        "suspend": True, "template": {"spec": {"containers": [{"name": "main"}]}}}, "status": {}})
    pods = [k.V1Pod.model_validate(UNSCHEDULABLE_POD)]
    opts = OPTS.model_copy(update={"queue_name": "temper-gpu"})
    assert classify(job, pods, 10 * OPTS.unschedulable_after_s, opts).state == "running"
    job.spec.suspend = False
    assert classify(job, pods, 10 * OPTS.unschedulable_after_s, opts).reason == "Unschedulable"
    assert classify(job, pods, OPTS.unschedulable_after_s - 1, opts).state == "running"


def failed_create_event(job: str, message: str, at: str = T0) -> dict:
    """What kube-controller-manager's job controller records when it cannot create a pod."""
    return {"metadata": {"name": f"{job}.1834a5b0c2d4e6f8", "namespace": "temper"}, "type": "Warning",
            "reason": "FailedCreate", "message": message, "count": 3, "firstTimestamp": T0, "lastTimestamp": at,
            "involvedObject": {"kind": "Job", "namespace": "temper", "name": job, "apiVersion": "batch/v1"},
            "source": {"component": "job-controller"}}


class Refusing(FakeApi):
    """The Job exists but the controller's pod creates are refused: its FailedCreate Events say why."""

    def __init__(self, events, pods=(), quotas=()):
        super().__init__({"active": len(pods), "startTime": T0}, pods=pods)
        self.events = [k.CoreV1Event.model_validate(e) for e in events]
        self.quotas = [k.V1ResourceQuota.model_validate(q) for q in quotas]

    def list_failed_creates(self, ns, job):
        return [e for e in self.events if e.involved_object.name == job.metadata.name]

    def list_resource_quotas(self, ns):
        return self.quotas


NO_SA = ('Error creating: pods "sft-abc-0-" is forbidden: error looking up service account temper/temper-workload: '
         'serviceaccount "temper-workload" not found')
QUOTA = ('Error creating: pods "sft-abc-1-" is forbidden: exceeded quota: pod-count, requested: pods=1, used: pods=1, '
         "limited: pods=1")


def test_pods_that_cannot_be_created_fail_at_once_naming_the_job_and_the_event():
    api = Refusing([failed_create_event("sft-abc", NO_SA)])
    launcher, now = _launcher(api)
    with pytest.raises(JobFailed) as e:
        launcher.run(_train(), lambda s: None)
    line = str(e.value)
    assert e.value.reason == "FailedCreate" and not e.value.retriable and "\n" not in line
    assert line.startswith("job 'sft-abc': FailedCreate:") and 'serviceaccount "temper-workload" not found' in line
    assert now[0] == 0 and "sft-abc-r1" not in api.created  # no wait for activeDeadlineSeconds, no retry
    assert ("Job", "sft-abc") in api.deleted and ("Service", "sft-abc") in api.deleted


def test_a_quota_that_can_never_admit_fails_at_once_and_a_full_one_after_the_grace_period():
    rank0 = pod("sft-abc-0-x7p2q", "Running")
    rank0["metadata"]["creationTimestamp"] = T0
    quota = {"metadata": {"name": "pod-count", "namespace": "temper"}, "spec": {"hard": {"pods": "1"}}}
    api = Refusing([failed_create_event("sft-abc", QUOTA)], pods=[rank0], quotas=[quota])
    launcher, now = _launcher(api)
    with pytest.raises(JobFailed) as e:
        launcher.run(_train(), lambda s: None)
    assert now[0] == 0 and "exceeded quota: pod-count" in str(e.value)
    assert "ResourceQuota temper/pod-count: allows pods=1 in total, but job 'sft-abc' needs 2" in str(e.value)

    quota["spec"]["hard"]["pods"] = "10"  # room for the Job once other runs' pods end: wait, as for Unschedulable
    api = Refusing([failed_create_event("sft-abc", QUOTA)], pods=[rank0], quotas=[quota])
    launcher, now = _launcher(api)
    with pytest.raises(JobFailed) as e:
        launcher.run(_train(), lambda s: None)
    assert OPTS.unschedulable_after_s <= now[0] < OPTS.unschedulable_after_s + 2 * OPTS.poll_interval_s
    assert e.value.reason == "FailedCreate" and "stayed full" in str(e.value)


def test_a_failed_create_older_than_the_newest_pod_is_history():
    """A refusal the controller has since got past (a pod was made after it) is not this poll's cause."""
    rank0 = k.V1Pod.model_validate({**pod("sft-abc-0-x7p2q", "Running"),
                                    "metadata": {"name": "sft-abc-0-x7p2q", "creationTimestamp": "2026-11-02T10:05:00Z"}})
    job = k.V1Job.model_validate({"metadata": {"name": "sft-abc"}, "spec": {"parallelism": 2, "completions": 2,
                                  "template": {"spec": {"containers": [{"name": "main"}]}}}, "status": {"active": 1}})
    api = Refusing([failed_create_event("sft-abc", NO_SA)])
    launcher, _ = _launcher(api)
    attempt = launcher.submit([job.model_copy(update={"metadata": k.V1ObjectMeta(name="sft-abc", namespace="temper")})])
    assert launcher._failed_create(attempt, job, [rank0], {}, 0.0) is None
    assert launcher._failed_create(attempt, job, [], {}, 0.0).reason == "FailedCreate"
    assert failed_create(job, [], None, 1e9, OPTS) is None


@pytest.mark.parametrize("reason,expect", [
    ("ErrImagePull", "ImagePullBackOff"), ("InvalidImageName", "ImagePullBackOff"),
    ("CreateContainerConfigError", "CreateContainerConfigError")])
def test_waiting_states_that_never_clear_fail_fast(reason, expect):
    message = {"ErrImagePull": 'failed to pull and unpack image "registry.example.com/temper-workload:0.1.0": '
                               "401 Unauthorized",
               "InvalidImageName": 'Failed to apply default image tag "Registry/x:": invalid reference format',
               "CreateContainerConfigError": 'secret "temper-s3" not found'}[reason]
    waiting = pod("sft-abc-0-x7p2q", "Pending", statuses=[container_status({"waiting": {"reason": reason,
                                                                                         "message": message}})])
    api = FakeApi({"active": 2, "startTime": T0}, pods=[waiting])
    launcher, _ = _launcher(api)
    with pytest.raises(JobFailed) as e:
        launcher.run(_train(), lambda s: None)
    assert e.value.reason == expect and not e.value.retriable and e.value.pod == "sft-abc-0-x7p2q"
    assert message in str(e.value) and ("Job", "sft-abc") in api.deleted


def test_crashloop_exit_message_reaches_the_user():
    crashed = pod("eval-abc-0-qk2vx", "Failed", statuses=[container_status(
        {"terminated": {"exitCode": 1, "reason": "Error", "message": "Traceback ...\nValueError: bad shard\n",
                        "startedAt": T0, "finishedAt": T0}})])
    job = k.V1Job.model_validate({"metadata": {"name": "eval-abc"}, "status": job_failed(
        "BackoffLimitExceeded", "Job has reached the specified backoff limit")})
    out = classify(job, [k.V1Pod.model_validate(crashed)], 0, OPTS)
    assert (out.reason, out.retriable, out.finished) == ("Error", True, True)
    assert "exited with code 1" in out.message and "ValueError: bad shard" in out.message


# --- the exec status channel (metav1.Status documents the API server sends) ----------------------
def test_exec_status_documents_map_to_exit_codes():
    assert exec_exit_code(b'{"metadata":{},"status":"Success"}', "p") == 0
    nonzero = (b'{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: '
               b'error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":'
               b'{"causes":[{"reason":"ExitCode","message":"3"}]}}')
    assert exec_exit_code(nonzero, "p") == 3
    not_found = (b'{"metadata":{},"status":"Failure","message":"OCI runtime exec failed: exec failed: unable to start '
                 b'container process: exec: \\"python3\\": executable file not found in $PATH: unknown",'
                 b'"reason":"InternalError","details":{"causes":[{"message":"OCI runtime exec failed"}]},"code":500}')
    with pytest.raises(KubernetesError, match="executable file not found"):
        exec_exit_code(not_found, "p")
    with pytest.raises(KubernetesError, match="without an exit status"):
        exec_exit_code(b"", "p")
