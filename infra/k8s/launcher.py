"""Run a JobSpec on Kubernetes: create (or adopt), watch, stream logs, map failures, clean up.

The launcher is a small state machine over the thin ``ClusterApi`` layer:

    submit:  create each object; 409 AlreadyExists -> adopt it (names are deterministic, so a
             retried Prefect task finds the Job its previous attempt created)
    watch:   poll Job + pods every ``poll_interval_s``; start a log follower per pod once it
             runs; fail fast on states a Job never leaves by itself (image pull errors, a
             missing Secret, pods Unschedulable past ``unschedulable_after_s``, pods the Job
             controller cannot create: its FailedCreate Events, below; a Job Kueue can never
             admit: its Workload's QuotaReserved condition, ``kueue_outcome``)
    finish:  Complete -> done; Failed -> ``JobFailed`` with the reason from pod statuses
             (OOMKilled, Evicted, DeadlineExceeded, ...); the headless Service is deleted
             (the Job is GC'd by ttlSecondsAfterFinished, so its logs stay readable a while)
    cancel:  a set ``cancel`` event, an exception or Ctrl-C in the watch deletes everything
             the attempt created and raises ``JobFailed(reason='Cancelled')``

Gang training retries: a failed attempt that may succeed again (a crashed rank, an evicted
node) becomes a new Job ``<name>-r<k>``, up to ``spec.retries``; the workload resumes from
its latest checkpoint.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.jobspec import JobSpec
from infra.k8s import manifests as m
from infra.k8s.errors import JobFailed, KubernetesError
from infra.k8s.options import KubernetesOptions
from infra.k8s.preflight import api_error_line, demand_of, quota_refusal

LogFn = Callable[[str], None]
FAIL_FAST_WAITING = {
    "ImagePullBackOff": "ImagePullBackOff", "ErrImagePull": "ImagePullBackOff", "InvalidImageName": "ImagePullBackOff",
    "CreateContainerConfigError": "CreateContainerConfigError",
}


class Api(Protocol):
    def create(self, obj: Any) -> Any: ...
    def read_job(self, namespace: str, name: str) -> k.V1Job: ...
    def list_pods(self, namespace: str, label_selector: str) -> list[k.V1Pod]: ...
    def delete(self, kind: str, namespace: str, name: str) -> None: ...
    def stream_log(self, namespace: str, pod: str, container: str): ...
    def list_failed_creates(self, namespace: str, job: k.V1Job) -> list[k.CoreV1Event]: ...
    def list_resource_quotas(self, namespace: str) -> list[k.V1ResourceQuota]: ...
    def list_workloads(self, namespace: str, job: k.V1Job) -> list[dict]: ...


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())[:200]


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


@dataclass
class Attempt:
    """What one attempt created (or adopted): the unit of watching and cleanup."""

    objects: list[Any]
    adopted: list[str] = field(default_factory=list)

    @property
    def jobs(self) -> list[k.V1Job]:
        return [o for o in self.objects if isinstance(o, k.V1Job)]

    @property
    def namespace(self) -> str:
        return self.objects[0].metadata.namespace


def _condition(job: k.V1Job, type_: str) -> k.V1JobCondition | None:
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
    if _condition(job, "Complete"):
        return Outcome("succeeded")
    failed = _condition(job, "Failed")
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
    newest = max(events, key=lambda e: (_when(e), e.count or 0))
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


def _when(event: k.CoreV1Event) -> datetime:
    return event.last_timestamp or event.event_time or event.first_timestamp or datetime.min.replace(tzinfo=timezone.utc)


def _missing_pods(job: k.V1Job, pods: list[k.V1Pod]) -> bool:
    """Fewer pods than the Job runs at once (and it is neither finished nor suspended): some could not be made."""
    spec = job.spec
    if spec is None or spec.suspend or _condition(job, "Complete") or _condition(job, "Failed"):
        return False
    done = (job.status.succeeded or 0) if job.status else 0
    want = min(spec.parallelism or 1, (spec.completions or spec.parallelism or 1) - done)
    live = [p for p in pods if not (p.metadata and p.metadata.deletion_timestamp)
            and (p.status is None or p.status.phase not in ("Succeeded", "Failed"))]
    return len(live) < want


def _unschedulable(pods: list[k.V1Pod]) -> bool:
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for p in pods for c in ((p.status.conditions if p.status else None) or []))


class KubernetesLauncher:
    def __init__(self, api: Api, opts: KubernetesOptions, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.api, self.opts, self.clock, self.sleep = api, opts, clock, sleep

    # --- submit -------------------------------------------------------------------------
    def submit(self, objects: list[Any], on_log: LogFn = print) -> Attempt:
        """Create (or adopt) every object; if one cannot be created, delete those this call created."""
        attempt = Attempt(objects=list(objects))
        created: list[Any] = []
        try:
            for obj in objects:
                if self._create_or_adopt(obj, attempt, on_log):
                    created.append(obj)
        except BaseException:
            if created:
                self.cleanup(Attempt(objects=created), on_log)
            raise
        return attempt

    def _create_or_adopt(self, obj: Any, attempt: Attempt, on_log: LogFn) -> bool:
        """True if created, False if adopted (409 on a deterministic name)."""
        name, kind = obj.metadata.name, obj.kind
        try:
            self.api.create(obj)
            on_log(f"created {kind} {obj.metadata.namespace}/{name}")
            return True
        except ApiException as e:
            if e.status != 409:  # one line: RBAC, a missing namespace, a quota, or the server's own words
                raise KubernetesError(api_error_line(e, "create", kind, name, obj.metadata.namespace)) from None
        if kind == "Job":
            existing = self.api.read_job(obj.metadata.namespace, name)
            owner = (existing.metadata.labels or {}).get(m.JOB_LABEL)
            if owner != name:
                raise KubernetesError(f"a Job named {name!r} exists in {obj.metadata.namespace!r} but was not "
                                      "created by temper (no temper.dev/job label); delete it or rename the run")
        attempt.adopted.append(name)
        on_log(f"adopted existing {kind} {obj.metadata.namespace}/{name}")
        return False

    def adopted_failure(self, attempt: Attempt) -> str | None:
        """An adopted Job that already failed (a previous task attempt's, kept for its logs): its name."""
        for job in attempt.jobs:
            if job.metadata.name in attempt.adopted and _condition(self.api.read_job(job.metadata.namespace,
                                                                                     job.metadata.name), "Failed"):
                return job.metadata.name
        return None

    # --- watch --------------------------------------------------------------------------
    def watch(self, attempt: Attempt, on_log: LogFn = print, cancel: threading.Event | None = None,
              limits: str = "") -> None:
        """Block until every Job of the attempt completes; raise JobFailed otherwise."""
        ns = attempt.namespace
        pending = {j.metadata.name for j in attempt.jobs}
        followers: dict[str, threading.Thread] = {}
        unschedulable_since: dict[str, float] = {}
        refused_since: dict[str, float] = {}
        queued_why: dict[str, str] = {}
        keep: set[str] = set()  # finished Jobs stay until their TTL (logs, post-mortem)
        try:
            while pending:
                if cancel is not None and cancel.is_set():
                    raise JobFailed(",".join(sorted(pending)), "Cancelled", "cancelled by the caller", False)
                for name in sorted(pending):
                    job = self.api.read_job(ns, name)
                    pods = self.api.list_pods(ns, f"{m.JOB_LABEL}={name}")
                    self._follow_logs(ns, pods, followers, on_log)
                    now = self.clock()
                    if _unschedulable(pods):
                        unschedulable_since.setdefault(name, now)
                    else:
                        unschedulable_since.pop(name, None)
                    outcome = classify(job, pods, now - unschedulable_since.get(name, now), self.opts, limits)
                    if outcome.state == "running":
                        outcome = self._failed_create(attempt, job, pods, refused_since, now) or outcome
                    if outcome.state == "running" and job.spec and job.spec.suspend and \
                            (job.metadata.labels or {}).get(m.QUEUE_LABEL):
                        refusal, why = kueue_outcome(job, self.api.list_workloads(ns, job))
                        if why and queued_why.get(name) != why:
                            on_log(f"job {name}: {why}")
                        queued_why[name] = why
                        outcome = refusal or outcome
                    if outcome.state == "succeeded":
                        on_log(f"job {name} complete")
                        pending.discard(name)
                        keep.add(name)
                    elif outcome.state == "failed":
                        if outcome.finished:
                            keep.add(name)
                        raise outcome.error(name)
                if pending:
                    self.sleep(self.opts.poll_interval_s)
        except BaseException:
            self.cleanup(attempt, on_log, keep=keep)
            raise
        finally:
            for t in followers.values():
                t.join(timeout=10)
        self._delete_services(attempt)

    def _failed_create(self, attempt: Attempt, job: k.V1Job, pods: list[k.V1Pod], since: dict[str, float],
                       now: float) -> Outcome | None:
        """Read the Job's FailedCreate Events when it has fewer pods than it should (one list call then)."""
        name = job.metadata.name
        events = self.api.list_failed_creates(attempt.namespace, job) if _missing_pods(job, pods) else []
        made = [p.metadata.creation_timestamp for p in pods if p.metadata and p.metadata.creation_timestamp]
        if made:  # a pod made after an Event (the same second counts as after it): that cause has passed
            events = [e for e in events if _when(e) >= max(made).replace(microsecond=0)]
        if not events:
            since.pop(name, None)
            return None
        since.setdefault(name, now)
        refusal = None
        if any("exceeded quota" in (e.message or "") for e in events):
            refusal = quota_refusal(self.api.list_resource_quotas(attempt.namespace), demand_of(attempt.objects), name)
        return failed_create(job, events, refusal, now - since[name], self.opts)

    def _follow_logs(self, ns: str, pods: list[k.V1Pod], followers: dict, on_log: LogFn) -> None:
        for pod in pods:
            name = pod.metadata.name
            phase = pod.status.phase if pod.status else None
            if name in followers or phase not in ("Running", "Succeeded", "Failed"):
                continue

            def follow(pod_name: str = name) -> None:
                try:
                    for line in self.api.stream_log(ns, pod_name, m.MAIN_CONTAINER):
                        on_log(f"[{pod_name}] {line}")
                except ApiException as e:  # pod deleted mid-stream: the watch loop reports the cause
                    on_log(f"[{pod_name}] log stream ended: {e.status} {e.reason}")

            t = threading.Thread(target=follow, name=f"log-{name}", daemon=True)
            followers[name] = t
            t.start()

    # --- cleanup ------------------------------------------------------------------------
    def cleanup(self, attempt: Attempt, on_log: LogFn = print, keep: set[str] = frozenset()) -> None:
        """Delete what the attempt created (Jobs cascade to pods) except finished Jobs in ``keep``."""
        for obj in reversed(attempt.objects):
            if obj.kind == "Job" and obj.metadata.name in keep:
                continue
            self.api.delete(obj.kind, obj.metadata.namespace, obj.metadata.name)
            on_log(f"deleted {obj.kind} {obj.metadata.namespace}/{obj.metadata.name}")

    def _delete_services(self, attempt: Attempt) -> None:
        for obj in attempt.objects:
            if obj.kind == "Service":  # Services have no TTL; the Job GCs itself
                self.api.delete("Service", obj.metadata.namespace, obj.metadata.name)

    # --- the whole run ------------------------------------------------------------------
    def run(self, spec: JobSpec, on_log: LogFn = print, shards: int = 1,
            cancel: threading.Event | None = None) -> str:
        """Run to success and return the name of the Job attempt that succeeded.

        Attempt names are ``<name>``, ``<name>-r1``, ...: a retried Prefect task adopts the Job its
        previous attempt left running; one that already failed (kept for its logs) is skipped, and
        the next name is a fresh attempt that resumes from the newest checkpoint in the store.
        """
        try:
            return self._run(spec, on_log, shards, cancel)
        finally:  # succeeded, failed, cancelled or killed: its pods are gone, so are the sandboxes they made
            self.reap_sandboxes(spec.name, on_log)

    def reap_sandboxes(self, job: str, on_log: LogFn = print) -> int:
        """Delete the sandbox pods a job's pods made and left (``OWNER_LABEL``): a pod that exits normally deletes
        its own (``close_shared``), one that fails or is killed cannot. Best effort, said in the log: a pod this
        misses still ends at its activeDeadlineSeconds. Returns how many were deleted."""
        ns = self.opts.sandbox_ns
        try:
            left = self.api.list_pods(ns, f"{m.OWNER_LABEL}={job}")
        except (ApiException, KubernetesError) as e:
            on_log(f"cannot list the sandbox pods job {job} left in {ns} ({_one_line(e)}); they end at their deadline")
            return 0
        deleted = 0
        for pod in left:
            try:
                self.api.delete("Pod", ns, pod.metadata.name)
                deleted += 1
            except (ApiException, KubernetesError) as e:
                on_log(f"sandbox pod {ns}/{pod.metadata.name}: delete failed ({_one_line(e)}); it ends at its deadline")
        if deleted:
            on_log(f"deleted {deleted} sandbox pod(s) job {job} left in {ns}")
        return deleted

    def _run(self, spec: JobSpec, on_log: LogFn, shards: int, cancel: threading.Event | None) -> str:
        limits = f"memory={spec.resources.memory}" if spec.kind != "sandbox" else f"memory={self.opts.sandbox_memory}"
        budget = spec.retries + 1 if spec.kind == "train" else 1  # eval shards retry via backoffLimit
        n, tried = 0, 0
        while True:
            objects = m.objects_for(spec, self.opts, shards=shards, attempt=n)
            attempt = self.submit(objects, on_log)
            stale = self.adopted_failure(attempt) if attempt.adopted else None
            if stale is not None and spec.kind == "train":
                on_log(f"job {stale} failed in an earlier attempt; starting {m.attempt_name(spec.name, n + 1)}")
                self._delete_services(attempt)
                n += 1
                continue
            tried += 1
            try:
                self.watch(attempt, on_log, cancel, limits)
                return objects[-1].metadata.name
            except JobFailed as e:
                if e.reason == "Cancelled" or not e.retriable or tried >= budget:
                    raise
                on_log(f"attempt {n} failed ({e}); retrying as {m.attempt_name(spec.name, n + 1)}, "
                       "resuming from the latest checkpoint")
                n += 1
