"""What a Job's state means: Job and pod statuses, FailedCreate Events and Kueue Workloads -> an ``Outcome``.

Pure functions over the Kubernetes client's models, so every failure a user can meet (OOMKilled,
Evicted, an image that cannot be pulled, a missing Secret, pods no node fits, pods the Job controller
cannot create, a Job Kueue can never admit) is mapped and unit-tested without a cluster; the
launcher (``infra.k8s.launcher``) polls and acts on what these say.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from kubernetes import client as k

from infra.k8s import manifests as m
from infra.k8s.errors import JobFailed
from infra.k8s.options import KubernetesOptions

FAIL_FAST_WAITING = {
    "ImagePullBackOff": "ImagePullBackOff", "ErrImagePull": "ImagePullBackOff", "InvalidImageName": "ImagePullBackOff",
    "CreateContainerConfigError": "CreateContainerConfigError",
}


@dataclass
class Outcome:
    state: str  # "running" | "succeeded" | "failed"
    reason: str = ""
    message: str = ""
    retriable: bool = False
    pod: str | None = None
    finished: bool = False  # the Job itself ended (kept for its logs) vs still running (deleted)

    def error(self, job: str) -> JobFailed:
        return JobFailed(job, self.reason, self.message, self.retriable, self.pod)


def condition(job: k.V1Job, type_: str) -> k.V1JobCondition | None:
    for c in (job.status.conditions if job.status else None) or []:
        if c.type == type_ and c.status == "True":
            return c
    return None


def _statuses(pod: k.V1Pod) -> list[k.V1ContainerStatus]:
    st = pod.status
    return list((st.container_statuses or []) + (st.init_container_statuses or [])) if st else []


def _failed_pod_outcome(pods: list[k.V1Pod], limits: str) -> Outcome | None:
    """Most specific cause first: OOM beats eviction beats a plain non-zero exit."""
    ordered = sorted(pods, key=lambda p: p.metadata.name)
    for pod in ordered:
        for cs in _statuses(pod):
            term = (cs.state and cs.state.terminated) or (cs.last_state and cs.last_state.terminated)
            if term and term.reason == "OOMKilled":
                return Outcome("failed", "OOMKilled", f"container {cs.name!r} exceeded its memory limit ({limits}); "
                               "raise resources.memory or lower the per-device batch size", False, pod.metadata.name)
    for pod in ordered:
        if pod.status and pod.status.reason == "Evicted":
            return Outcome("failed", "Evicted", f"evicted by the kubelet: {pod.status.message or 'node pressure'}",
                           True, pod.metadata.name)
    for pod in ordered:
        for cs in _statuses(pod):
            term = cs.state and cs.state.terminated
            if term and term.exit_code:
                tail = f": {term.message.strip()[-300:]}" if term.message else ""
                return Outcome("failed", "Error", f"container {cs.name!r} exited with code {term.exit_code} "
                               f"({term.reason or 'Error'}){tail}", True, pod.metadata.name)
    return None


def classify(job: k.V1Job, pods: list[k.V1Pod], unschedulable_for_s: float, opts: KubernetesOptions,
             limits: str = "") -> Outcome:
    """Pure: Job + pod statuses -> running / succeeded / failed with a reason a user can act on."""
    name = job.metadata.name
    if condition(job, "Complete"):
        return Outcome("succeeded")
    failed = condition(job, "Failed")
    if failed:
        if failed.reason == "DeadlineExceeded":
            deadline = job.spec.active_deadline_seconds if job.spec else None
            return Outcome("failed", "DeadlineExceeded", f"ran longer than activeDeadlineSeconds={deadline} "
                           "(spec.timeout_s); raise it or shorten the run", False, finished=True)
        found = _failed_pod_outcome(pods, limits) or Outcome(
            "failed", failed.reason or "Failed", failed.message or f"job {name} failed", True)
        found.finished = True
        return found
    for pod in pods:
        for cs in _statuses(pod):
            waiting = cs.state and cs.state.waiting
            if waiting and waiting.reason in FAIL_FAST_WAITING:
                hint = ("check the image name/tag and imagePullSecrets" if "Image" in waiting.reason
                        else "a Secret or ConfigMap the pod references is missing (e.g. the S3 secret)")
                return Outcome("failed", FAIL_FAST_WAITING[waiting.reason],
                               f"{waiting.message or waiting.reason}; {hint}", False, pod.metadata.name)
    suspended = bool(job.spec and job.spec.suspend)
    if unschedulable_for_s >= opts.unschedulable_after_s and not suspended:
        msg = next((c.message for p in pods for c in (p.status.conditions or []) if c.reason == "Unschedulable"), "")
        return Outcome("failed", "Unschedulable", f"pods unschedulable for {unschedulable_for_s:.0f}s: {msg}; "
                       "check resources, nodeSelector/tolerations and the ResourceQuota", False)
    return Outcome("running")


def failed_create(job: k.V1Job, events: list[k.CoreV1Event], refusal: str | None, blocked_for_s: float,
                  opts: KubernetesOptions) -> Outcome | None:
    """Pure: the Job controller could not create the Job's pods (its FailedCreate Events) -> failed, or None.

    The Job itself never fails for this: the controller retries with back-off until
    activeDeadlineSeconds, so without reading the Events a missing service account or an
    admission refusal costs the whole deadline. A refusal by a ResourceQuota can pass once other
    pods end, so it fails at once only when the quota could never admit the Job (``refusal``, from
    ``preflight.quota_refusal``), else after ``unschedulable_after_s`` of refusals, as Unschedulable does.
    """
    if not events:
        return None
    newest = max(events, key=lambda e: (when(e), e.count or 0))
    said = " ".join((newest.message or "").split())[:400]
    where = f"the Job controller cannot create its pods ({said})"
    if "exceeded quota" not in said:
        return Outcome("failed", "FailedCreate", f"{where}; fix what the message names (service account, "
                       "PriorityClass, RuntimeClass, admission policy) and run again", False)
    if refusal:
        return Outcome("failed", "FailedCreate", f"{where}; {refusal}", False)
    if blocked_for_s >= opts.unschedulable_after_s:
        return Outcome("failed", "FailedCreate", f"{where} for {blocked_for_s:.0f}s; the namespace's ResourceQuota "
                       "stayed full: wait for other runs or raise the quota", False)
    return None


# Kueue's QuotaReserved=False reasons (and message parts, for Kueue before 0.19, which said "Pending")
# that no waiting changes: a request above the ClusterQueue's nominal quota, a resource it does not cover, a missing
# LocalQueue/ClusterQueue or a namespace its selector does not match.
KUEUE_NEVER_REASONS = {"ExceedsMaxQuota", "Misconfigured"}
KUEUE_NEVER_MESSAGES = ("> maximum capacity", "unavailable in ClusterQueue", "doesn't exist",
                        "doesn't match ClusterQueue selector")


def kueue_outcome(job: k.V1Job, workloads: list[dict]) -> tuple[Outcome | None, str]:
    """Pure: a suspended, queued Job's Kueue Workloads -> (failed if Kueue can never admit it, why it waits).

    Kueue holds the Job suspended and writes why on its Workload (``QuotaReserved`` False, reason
    and message, e.g. "couldn't assign flavors to pod set main: insufficient quota for cpu in flavor
    gpu, previously considered podsets requests (0) + current podset request (8) > maximum capacity
    (4)"). Waiting behind other Workloads (WaitingForQuota) is normal; the never-admissible cases fail.
    """
    queue = (job.metadata.labels or {}).get(m.QUEUE_LABEL, "")
    for wl in workloads:
        cond = next((c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") == "QuotaReserved"), None)
        if not cond or cond.get("status") != "False":
            continue
        said = " ".join((cond.get("message") or "").split())[:500]
        where = f"Kueue cannot admit it from LocalQueue {job.metadata.namespace}/{queue}"
        if cond.get("reason") in KUEUE_NEVER_REASONS or any(part in said for part in KUEUE_NEVER_MESSAGES):
            fix = ("create the LocalQueue/ClusterQueue or set queue_name" if cond.get("reason") == "Misconfigured"
                   or "exist" in said or "selector" in said else
                   "the job asks for more than the ClusterQueue's nominalQuota: lower its resources or ranks, "
                   "or raise the quota")
            return Outcome("failed", "Inadmissible", f"{where} ({cond.get('reason')}: {said}); {fix}", False), ""
        return None, f"{where} yet ({cond.get('reason')}: {said})"
    return None, ""


def when(event: k.CoreV1Event) -> datetime:
    return event.last_timestamp or event.event_time or event.first_timestamp or datetime.min.replace(tzinfo=timezone.utc)


def missing_pods(job: k.V1Job, pods: list[k.V1Pod]) -> bool:
    """Fewer pods than the Job runs at once (and it is neither finished nor suspended): some could not be made."""
    spec = job.spec
    if spec is None or spec.suspend or condition(job, "Complete") or condition(job, "Failed"):
        return False
    done = (job.status.succeeded or 0) if job.status else 0
    want = min(spec.parallelism or 1, (spec.completions or spec.parallelism or 1) - done)
    live = [p for p in pods if not (p.metadata and p.metadata.deletion_timestamp)
            and (p.status is None or p.status.phase not in ("Succeeded", "Failed"))]
    return len(live) < want


def unschedulable(pods: list[k.V1Pod]) -> bool:
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for p in pods for c in ((p.status.conditions if p.status else None) or []))
