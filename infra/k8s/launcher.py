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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.jobspec import JobSpec
from infra.k8s import manifests as m
from infra.k8s.errors import JobFailed, KubernetesError
from infra.k8s.options import KubernetesOptions
from infra.k8s.outcomes import (Outcome, classify, condition, failed_create, kueue_outcome, missing_pods,
                                 unschedulable, when)
from infra.k8s.preflight import api_error_line, demand_of, quota_refusal

LogFn = Callable[[str], None]


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
            if job.metadata.name in attempt.adopted and condition(self.api.read_job(job.metadata.namespace,
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
                    job = self._read_watched(ns, name)
                    pods = self.api.list_pods(ns, f"{m.JOB_LABEL}={name}")
                    self._follow_logs(ns, pods, followers, on_log)
                    now = self.clock()
                    if unschedulable(pods):
                        unschedulable_since.setdefault(name, now)
                    else:
                        unschedulable_since.pop(name, None)
                    outcome = classify(job, pods, now - unschedulable_since.get(name, now), self.opts, limits)
                    if outcome.state == "running" or outcome.state == "failed" and missing_pods(job, pods):
                        # a rank that failed while the controller could not create its peers failed for that
                        # reason: its FailedCreate Events name the cause, a retry would not help
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

    def _read_watched(self, ns: str, name: str) -> k.V1Job:
        """The Job being watched; one that is gone (``kubectl delete``, or a ``ttlSecondsAfterFinished`` shorter than
        a poll) ends the watch with its cause named: how it ended is unknown, so no retry is tried."""
        try:
            return self.api.read_job(ns, name)
        except ApiException as e:
            if e.status != 404:
                raise
            raise JobFailed(name, "Deleted", f"Job {ns}/{name} was deleted while temper watched it (kubectl delete, or "
                            f"ttlSecondsAfterFinished={self.opts.ttl_seconds_after_finished} ran out before the next "
                            "poll); its outcome is unknown", False) from None

    def _failed_create(self, attempt: Attempt, job: k.V1Job, pods: list[k.V1Pod], since: dict[str, float],
                       now: float) -> Outcome | None:
        """Read the Job's FailedCreate Events when it has fewer pods than it should (one list call then)."""
        name = job.metadata.name
        events = self.api.list_failed_creates(attempt.namespace, job) if missing_pods(job, pods) else []
        made = [p.metadata.creation_timestamp for p in pods if p.metadata and p.metadata.creation_timestamp]
        if made:  # a pod made after an Event (the same second counts as after it): that cause has passed
            events = [e for e in events if when(e) >= max(made).replace(microsecond=0)]
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
