"""The Job controller (kube-controller-manager's ``job`` controller), level-triggered.

Each ``sync`` reconciles every unfinished Job with its pods (selected by the Job's
``batch.kubernetes.io/controller-uid``), as the real controller does:

- pods are created from the template with an owner reference to the Job and the
  ``batch.kubernetes.io/job-tracking`` finalizer; a terminal pod is counted into
  ``status.succeeded``/``failed`` exactly once, then its finalizer is removed;
- ``completionMode: Indexed``: one pod per index, named ``<job>-<i>-<random>``, with the
  ``batch.kubernetes.io/job-completion-index`` annotation and label, ``hostname: <job>-<i>``
  (with the template's ``subdomain`` that gives ``<job>-<i>.<subdomain>`` DNS names) and the
  ``JOB_COMPLETION_INDEX`` env var (a fieldRef to that annotation); ``completedIndexes``;
  Complete when every index has succeeded. NonIndexed: Complete at ``completions`` successes;
- ``parallelism`` caps the running pods; ``suspend: true`` deletes running pods and sets
  the ``Suspended`` condition, resuming resets ``startTime``;
- ``podFailurePolicy``: rules in order, the first match wins: ``onExitCodes`` (In/NotIn over
  non-zero exit codes of the named or any container) and ``onPodConditions``; ``FailJob`` fails
  the Job at once (reason ``PodFailurePolicy``), ``Ignore`` does not count the failure (the index is
  recreated: how a disruption such as an eviction is absorbed), ``Count`` counts it. With a policy,
  a replacement pod is only made once the old one is terminal (podReplacementPolicy ``Failed``);
- ``backoffLimit``: more counted failures than that -> Failed ``BackoffLimitExceeded``;
- ``activeDeadlineSeconds`` since ``startTime`` -> Failed ``DeadlineExceeded``;
- a finished Job deletes its running pods; conditions ``FailureTarget``/``SuccessCriteriaMet``
  come before ``Failed``/``Complete`` (1.31+ order); pods that cannot be created (quota,
  service account) leave a ``FailedCreate`` Warning Event and are retried.

Cut: no exponential back-off before re-creating a failed pod (it is immediate), no
``backoffLimitPerIndex``/``FailIndex`` (treated as Count), no ``successPolicy``, no
``podReplacementPolicy`` field (derived from whether a podFailurePolicy is set, the default).
"""

from __future__ import annotations

import copy
import datetime as dt
import uuid

from tests.k8s_standin import admission
from tests.k8s_standin.store import ApiError, Store, now

TRACKING = "batch.kubernetes.io/job-tracking"
INDEX = "batch.kubernetes.io/job-completion-index"
INDEX_FIELD = f"metadata.annotations['{INDEX}']"


def _terminal(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def _cond(job: dict, type_: str) -> dict | None:
    return next((c for c in job.get("status", {}).get("conditions", []) if c["type"] == type_ and c["status"] == "True"), None)


def finished(job: dict) -> bool:
    return bool(_cond(job, "Complete") or _cond(job, "Failed"))


def _set_cond(status: dict, type_: str, value: str, reason: str = "", message: str = "") -> None:
    conds = [c for c in status.get("conditions", []) if c["type"] != type_]
    stamp = now()
    conds.append({"type": type_, "status": value, "reason": reason, "message": message,
                  "lastProbeTime": stamp, "lastTransitionTime": stamp})
    status["conditions"] = conds


def _index_set(indexes: set[int]) -> str:
    """``completedIndexes`` format: '0-2,5'."""
    out, run = [], []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _parse_index_set(text: str | None) -> set[int]:
    done: set[int] = set()
    for part in filter(None, (text or "").split(",")):
        a, _, b = part.partition("-")
        done.update(range(int(a), int(b or a) + 1))
    return done


def match_policy(policy: dict | None, pod: dict) -> tuple[str, str]:
    """(action, why) of the first podFailurePolicy rule the failed pod matches; Count if none."""
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    for i, rule in enumerate((policy or {}).get("rules", [])):
        codes = rule.get("onExitCodes")
        if codes:
            for cs in pod.get("status", {}).get("containerStatuses", []):
                term = (cs.get("state") or {}).get("terminated")
                if not term or term["exitCode"] == 0 or codes.get("containerName") not in (None, cs["name"]):
                    continue
                inside = term["exitCode"] in codes.get("values", [])
                if inside == (codes.get("operator") == "In"):
                    return rule["action"], (f"Container {cs['name']} for pod {ns}/{name} failed with exit code "
                                            f"{term['exitCode']} matching {rule['action']} rule at index {i}")
        for pattern in rule.get("onPodConditions") or []:
            for c in pod.get("status", {}).get("conditions", []):
                if c["type"] == pattern["type"] and c["status"] == pattern.get("status", "True"):
                    return rule["action"], (f"Pod {ns}/{name} has condition {c['type']} matching "
                                            f"{rule['action']} rule at index {i}")
    return "Count", ""


class JobController:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._events: set[tuple[str, str]] = set()

    def sync(self) -> None:
        jobs = {j["metadata"]["uid"]: j for j in self.store.list("Job")}
        for job in jobs.values():
            if not job["metadata"].get("deletionTimestamp"):
                self._sync_job(job)
        for pod in self.store.list("Pod"):  # orphaned tracking finalizers (the Job is gone)
            owner = next((r["uid"] for r in pod["metadata"].get("ownerReferences") or [] if r["kind"] == "Job"), None)
            if TRACKING in (pod["metadata"].get("finalizers") or []) and owner not in jobs and (
                    _terminal(pod) or pod["metadata"].get("deletionTimestamp")):
                self._release(pod)

    def _release(self, pod: dict) -> None:
        pod["metadata"]["finalizers"] = [f for f in pod["metadata"].get("finalizers", []) if f != TRACKING]
        self.store.replace(pod)

    def _sync_job(self, job: dict) -> None:
        spec, status = job["spec"], job.setdefault("status", {})
        before = copy.deepcopy(status)
        pods = self.store.list("Pod", job["metadata"]["namespace"], f"{admission.CONTROLLER_UID}={job['metadata']['uid']}")
        indexed = spec.get("completionMode") == "Indexed"
        done = _parse_index_set(status.get("completedIndexes"))
        fail_job = ""
        for pod in pods:  # count terminal pods once, then release them
            if TRACKING not in (pod["metadata"].get("finalizers") or []):
                continue
            if not _terminal(pod) and pod["metadata"].get("deletionTimestamp") and not pod["spec"].get("nodeName"):
                pod.setdefault("status", {})["phase"] = "Failed"  # what the pod GC does to unscheduled terminating pods
            if not _terminal(pod):
                continue
            if pod["status"]["phase"] == "Succeeded":
                if indexed:
                    done.add(int(pod["metadata"]["annotations"][INDEX]))
                status["succeeded"] = len(done) if indexed else status.get("succeeded", 0) + 1
            else:
                action, why = match_policy(spec.get("podFailurePolicy"), pod)
                if action == "FailJob" and not fail_job:
                    fail_job = why
                if action != "Ignore":
                    status["failed"] = status.get("failed", 0) + 1
            self._release(pod)
        if indexed:
            status["completedIndexes"] = _index_set(done)
        live = [p for p in pods if not _terminal(p)]
        terminating = [p for p in live if p["metadata"].get("deletionTimestamp")]
        active = [p for p in live if not p["metadata"].get("deletionTimestamp")]
        if finished(job):
            self._delete(active)
            return
        if spec.get("suspend"):
            self._delete(active)
            if not _cond(job, "Suspended"):
                _set_cond(status, "Suspended", "True", "JobSuspended", "Job suspended")
                status.pop("startTime", None)
            active = []
        else:
            if _cond(job, "Suspended"):
                _set_cond(status, "Suspended", "False", "JobResumed", "Job resumed")
            status.setdefault("startTime", now())
        failure = None
        if fail_job:
            failure = ("PodFailurePolicy", fail_job)
        elif status.get("failed", 0) > spec.get("backoffLimit", 6):
            failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif spec.get("activeDeadlineSeconds") and status.get("startTime") and not spec.get("suspend"):
            started = dt.datetime.strptime(status["startTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
            if (dt.datetime.now(dt.timezone.utc) - started).total_seconds() > spec["activeDeadlineSeconds"]:
                failure = ("DeadlineExceeded", "Job was active longer than specified deadline")
        complete = (len(done) >= spec["completions"]) if indexed else status.get("succeeded", 0) >= spec["completions"]
        if failure:
            self._delete(active)
            active = []
            _set_cond(status, "FailureTarget", "True", *failure)
            _set_cond(status, "Failed", "True", *failure)
        elif complete:
            _set_cond(status, "SuccessCriteriaMet", "True", "CompletionsReached", "Reached expected number of succeeded pods")
            _set_cond(status, "Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods")
            status["completionTime"] = now()
        elif not spec.get("suspend"):
            active += self._create_missing(job, active, terminating if spec.get("podFailurePolicy") else [], done)
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if any(c["type"] == "Ready" and c["status"] == "True"
                                                       for c in p.get("status", {}).get("conditions", [])))
        status["terminating"] = len(terminating)
        if status != before:
            self.store.replace(job)

    def _delete(self, pods: list[dict]) -> None:
        for pod in pods:
            try:
                self.store.delete("Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
            except ApiError:
                pass

    def _create_missing(self, job: dict, active: list[dict], blocking: list[dict], done: set[int]) -> list[dict]:
        spec = job["spec"]
        room = spec["parallelism"] - len(active) - len(blocking)
        if spec.get("completionMode") == "Indexed":
            busy = {int(p["metadata"]["annotations"][INDEX]) for p in active + blocking}
            wanted = [i for i in range(spec["completions"]) if i not in done and i not in busy]
        else:
            wanted = [None] * max(0, spec["completions"] - job["status"].get("succeeded", 0) - len(active) - len(blocking))
        made = []
        for index in wanted[:max(0, room)]:
            pod = self._pod(job, index)
            try:
                made.append(self.store.create("Pod", job["metadata"]["namespace"], pod,
                                              admit=lambda p: admission.admit_pod(self.store, job["metadata"]["namespace"], p)))
            except ApiError as e:
                self._event(job, "FailedCreate", f"Error creating: {e.message}")
        return made

    def _pod(self, job: dict, index: int | None) -> dict:
        name = job["metadata"]["name"]
        template = copy.deepcopy(job["spec"]["template"])
        meta, spec = template.setdefault("metadata", {}), template["spec"]
        meta["generateName"] = f"{name}-{index}-" if index is not None else f"{name}-"
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job["metadata"]["uid"],
                                    "controller": True, "blockOwnerDeletion": True}]
        meta["finalizers"] = [TRACKING]
        if index is not None:
            meta["annotations"] = {**(meta.get("annotations") or {}), INDEX: str(index)}
            meta["labels"] = {**(meta.get("labels") or {}), INDEX: str(index)}
            spec["hostname"] = f"{name}-{index}"
            for c in spec["containers"]:
                c["env"] = (c.get("env") or []) + [{"name": "JOB_COMPLETION_INDEX",
                                                     "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}}}]
        return template

    def _event(self, job: dict, reason: str, message: str) -> None:
        key = (job["metadata"]["uid"], message)
        if key in self._events:
            return
        self._events.add(key)
        ns = job["metadata"]["namespace"]
        self.store.create("Event", ns, {"metadata": {"name": f"{job['metadata']['name']}.{uuid.uuid4().hex[:16]}"},
                                        "involvedObject": {"kind": "Job", "namespace": ns, "name": job["metadata"]["name"],
                                                           "uid": job["metadata"]["uid"], "apiVersion": "batch/v1"},
                                        "reason": reason, "message": message, "type": "Warning", "count": 1,
                                        "firstTimestamp": now(), "lastTimestamp": now(),
                                        "source": {"component": "job-controller"}})
