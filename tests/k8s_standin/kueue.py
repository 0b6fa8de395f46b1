"""Kueue on the stand-in: Workloads for queued Jobs, quota-based admission, usage released at the end.

What Kueue v0.19 (kueue.x-k8s.io/v1beta2) does for a batch/v1 Job, at small scale, with Kueue's
own condition reasons and message shapes (so the launcher reads what it would on a cluster):

- a Job carrying ``kueue.x-k8s.io/queue-name`` gets a Workload ``job-<name>-<hash>`` in its
  namespace, owned by the Job (garbage-collected with it), labelled ``kueue.x-k8s.io/job-uid``,
  with one pod set ``main`` (count = parallelism, the Job's pod template), the queue name and the
  priority of the pods' PriorityClass (``priorityClassRef``). A queued Job that is not suspended
  while its Workload is not admitted is suspended again (Kueue's job reconciler);
- the LocalQueue's ClusterQueue admits Workloads by priority, then age (``StrictFIFO`` stops at
  the first that does not fit, ``BestEffortFIFO`` lets a later one pass it). One fits when every
  resource its pods request (count x requests, defaulting to limits) has room in a flavor of the
  group covering it: admitted, unfinished usage + request <= ``nominalQuota``. Flavors are tried
  in order, skipping one whose ``nodeLabels``/``nodeTaints`` the pods contradict/do not tolerate;
- admitted: ``status.admission`` (clusterQueue, podSetAssignments with flavors, resourceUsage,
  count), conditions ``QuotaReserved`` and ``Admitted`` True; the Job is unsuspended with the
  flavor's nodeLabels added to its pods' nodeSelector and the flavor's tolerations to theirs;
- not admitted: ``QuotaReserved`` False, reason ``ExceedsMaxQuota`` with "couldn't assign flavors
  to pod set main: insufficient quota for cpu in flavor F, previously considered podsets requests
  (0) + current podset request (8) > maximum capacity (4)" when the request is above the nominal
  quota (it can never be admitted), ``WaitingForQuota`` with "insufficient unused quota for cpu in
  flavor F, 2 more needed" when others hold the quota, ``Misconfigured`` when the LocalQueue or
  the ClusterQueue does not exist or the namespace does not match the ClusterQueue's
  ``namespaceSelector``; "resource X unavailable in ClusterQueue" when no group covers it;
- the Job Complete or Failed: the Workload gets ``Finished`` True (reason Succeeded/Failed) and its
  usage is released, so the next Workload is admitted;
- ClusterQueue and LocalQueue status: pending/reserving/admitted counts, ``flavorsUsage``,
  condition ``Active``. A ClusterQueue with a negative quota is refused as Kueue's webhook does.

Cut: cohorts, borrowing/lending, preemption (``preemption`` is accepted, never acted on: a waiting
higher-priority Workload is admitted first but does not evict a running one), fair sharing,
admission checks, partial admission, ``waitForPodsReady``, topology-aware scheduling, the
v1beta1 API (deprecated since v0.16; only v1beta2 is served here), Workloads for kinds other than
Job, and Kueue's defaulting webhook that suspends a labelled Job on create (temper creates them
suspended itself).
"""

from __future__ import annotations

import copy
import functools
import hashlib
from decimal import Decimal
from pathlib import Path

from kubernetes.utils import parse_quantity

from tests.k8s_standin import crds
from tests.k8s_standin.admission import pod_amounts
from tests.k8s_standin.controllers import tolerates
from tests.k8s_standin.store import ApiError, Store, matches, now

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "Workload")
POD_SET = "main"


@functools.lru_cache(maxsize=4)
def _crds(directory: str) -> dict:
    return crds.load_crds(Path(directory))


def admit(store: Store, obj: dict) -> None:
    """What the API server (with Kueue's CRDs) and Kueue's validating webhook refuse on create."""
    if not obj.get("apiVersion"):
        obj["apiVersion"] = f"{GROUP}/{VERSION}"
    schemas = _crds(str(crds.crd_dir()))
    if schemas:  # without the CRD files (tests/k8s_standin/crds.py) objects are stored unchecked
        errors = crds.validate(obj, schemas)
        if errors:
            raise ApiError(422, "Invalid", f'{obj["kind"]}.{GROUP} "{obj["metadata"]["name"]}" is invalid: '
                           + "; ".join(errors), obj["kind"], obj["metadata"]["name"])
    if obj["kind"] == "ClusterQueue":
        bad = negative_quotas(obj)
        if bad:
            raise ApiError(403, "Forbidden", f'admission webhook "vclusterqueue.kb.io" denied the request: {bad[0]}',
                           obj["kind"], obj["metadata"]["name"])


def negative_quotas(cq: dict) -> list[str]:
    """Kueue's webhook (validateResourceQuantity): quotas and limits must be non-negative."""
    out = []
    for g, group in enumerate(cq.get("spec", {}).get("resourceGroups") or []):
        for f, flavor in enumerate(group.get("flavors") or []):
            for r, res in enumerate(flavor.get("resources") or []):
                for key in ("nominalQuota", "borrowingLimit", "lendingLimit"):
                    if key in res and parse_quantity(res[key]) < 0:
                        out.append(f"spec.resourceGroups[{g}].flavors[{f}].resources[{r}].{key}: Invalid value: "
                                   f'"{res[key]}": must be greater than or equal to 0')
    return out


def _cond(obj: dict, type_: str) -> dict | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), None)


def _true(obj: dict, type_: str) -> bool:
    c = _cond(obj, type_)
    return bool(c and c["status"] == "True")


def _set_cond(obj: dict, type_: str, status: str, reason: str, message: str) -> bool:
    """Set a condition; True if it changed (lastTransitionTime moves only when the status does)."""
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    old = next((c for c in conds if c["type"] == type_), None)
    if old and (old["status"], old["reason"], old["message"]) == (status, reason, message):
        return False
    stamp = old["lastTransitionTime"] if old and old["status"] == status else now()
    new = {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": stamp}
    obj["status"]["conditions"] = [c for c in conds if c["type"] != type_] + [new]
    return True


def _job_finished(job: dict) -> str | None:
    for c in job.get("status", {}).get("conditions", []):
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c["type"]
    return None


def quantity(resource: str, value: Decimal) -> str:
    """How Kueue prints an amount (resource.Quantity: DecimalSI for cpu, BinarySI for memory)."""
    if resource == "cpu" and value != value.to_integral():
        return f"{int(value * 1000)}m"
    if resource == "memory":
        for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value and value % size == 0:
                return f"{int(value // size)}{suffix}"
    return str(int(value)) if value == value.to_integral() else str(value)


def _requests(wl: dict) -> dict[str, Decimal]:
    """Pod count x the pod's requests, over the Workload's pod sets (all of them 'main' here)."""
    total: dict[str, Decimal] = {}
    for ps in wl["spec"]["podSets"]:
        per_pod = pod_amounts({"spec": ps["template"]["spec"]}, "requests")
        for res, amount in per_pod.items():
            total[res] = total.get(res, Decimal(0)) + Decimal(str(amount)) * ps.get("count", 1)
    return {r: v for r, v in total.items() if v}


class KueueController:
    """One control loop: Workloads for queued Jobs, then admission per ClusterQueue, then status."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._order: dict[str, int] = {}  # Workload uid -> creation order (timestamps have 1 s resolution)

    def sync(self) -> None:
        self._workloads_for_jobs()
        self._finish()
        for cq in self.store.list("ClusterQueue"):
            self._admit(cq)
        self._unroutable()
        self._queue_status()

    # --- Jobs -> Workloads -------------------------------------------------------------------------
    def _workloads_for_jobs(self) -> None:
        owned = {w["metadata"].get("labels", {}).get(JOB_UID_LABEL): w for w in self.store.list("Workload")}
        for job in self.store.list("Job"):
            meta = job["metadata"]
            queue = (meta.get("labels") or {}).get(QUEUE_LABEL)
            if not queue or meta.get("deletionTimestamp"):
                continue
            wl = owned.get(meta["uid"])
            if wl is None:
                if _job_finished(job):
                    continue
                wl = self._create_workload(job, queue)
            if not job["spec"].get("suspend") and not _true(wl, "QuotaReserved") and not _job_finished(job):
                job["spec"]["suspend"] = True  # started without admission: Kueue stops it
                self.store.replace(job)

    def _create_workload(self, job: dict, queue: str) -> dict:
        meta, spec = job["metadata"], job["spec"]
        template = copy.deepcopy(spec["template"])
        template.setdefault("metadata", {})
        pc_name = template.get("spec", {}).get("priorityClassName")
        pc = self.store.find("PriorityClass", "", pc_name) if pc_name else None
        digest = hashlib.sha1(f"{meta['name']}/{meta['uid']}".encode()).hexdigest()[:5]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload",
                "metadata": {"name": f"job-{meta['name']}-{digest}"[:253], "labels": {JOB_UID_LABEL: meta["uid"]},
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                                  "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
                "spec": {"active": True, "queueName": queue,
                         "podSets": [{"name": POD_SET, "count": spec.get("parallelism", 1), "template": template}],
                         "priority": (pc or {}).get("value", 0)}}
        if pc is not None:
            body["spec"]["priorityClassRef"] = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pc_name}
        wl = self.store.create("Workload", meta["namespace"], body, admit=lambda o: admit(self.store, o))
        self._order[wl["metadata"]["uid"]] = int(wl["metadata"]["resourceVersion"])
        return wl

    def _finish(self) -> None:
        for wl in self.store.list("Workload"):
            if _true(wl, "Finished") or not _true(wl, "QuotaReserved"):
                continue
            owner = next((r for r in wl["metadata"].get("ownerReferences") or [] if r["kind"] == "Job"), None)
            job = self.store.find("Job", wl["metadata"]["namespace"], owner["name"]) if owner else None
            if job is None or job["metadata"]["uid"] != owner["uid"]:
                continue  # the garbage collector deletes it (and with it its usage)
            state = _job_finished(job)
            if state:
                ok = state == "Complete"
                _set_cond(wl, "Finished", "True", "Succeeded" if ok else "Failed",
                          "Job finished successfully" if ok else "Job failed")
                self.store.replace(wl)

    # --- admission ---------------------------------------------------------------------------------
    def _pending(self, wl: dict) -> bool:
        return not _true(wl, "QuotaReserved") and not _true(wl, "Finished") and not wl["metadata"].get("deletionTimestamp")

    def _admit(self, cq: dict) -> None:
        name = cq["metadata"]["name"]
        queues = {(lq["metadata"]["namespace"], lq["metadata"]["name"]) for lq in self.store.list("LocalQueue")
                  if lq["spec"].get("clusterQueue") == name}
        workloads = [w for w in self.store.list("Workload") if (w["metadata"]["namespace"], w["spec"].get("queueName")) in queues]
        usage: dict[tuple[str, str], Decimal] = {}
        for wl in workloads:
            if _true(wl, "QuotaReserved") and not _true(wl, "Finished"):
                for ps in wl["status"]["admission"]["podSetAssignments"]:
                    for res, flavor in ps["flavors"].items():
                        key = (flavor, res)
                        usage[key] = usage.get(key, Decimal(0)) + parse_quantity(ps["resourceUsage"][res])
        pending = sorted((w for w in workloads if self._pending(w)),
                         key=lambda w: (-w["spec"].get("priority", 0), w["metadata"]["creationTimestamp"],
                                        self._order.get(w["metadata"]["uid"], 0)))
        selector = cq["spec"].get("namespaceSelector")
        for wl in pending:
            ns = self.store.find("Namespace", "", wl["metadata"]["namespace"])
            if selector is not None and not self._selects(selector, (ns or {}).get("metadata", {}).get("labels")):
                self._refuse(wl, "Misconfigured", "workload namespace doesn't match ClusterQueue selector")
                continue
            fit, reason, message = self._assign(cq, wl, usage)
            if fit is None:
                self._refuse(wl, reason, message)
                if cq["spec"].get("queueingStrategy") == "StrictFIFO":
                    break
                continue
            for key, amount in fit.items():
                usage[key] = usage.get(key, Decimal(0)) + amount
            self._admit_workload(cq, wl, fit)

    @staticmethod
    def _selects(selector: dict, labels: dict | None) -> bool:
        reqs = [(k, "=", {v}) for k, v in (selector.get("matchLabels") or {}).items()]
        ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
        reqs += [(e["key"], ops[e["operator"]], set(e.get("values") or [])) for e in selector.get("matchExpressions") or []]
        return matches(labels, reqs)

    def _flavor_misfit(self, flavor_name: str, template: dict) -> str | None:
        flavor = self.store.find("ResourceFlavor", "", flavor_name)
        if flavor is None:
            return f"flavor {flavor_name} not found"
        spec, pod = flavor.get("spec", {}), template.get("spec", {})
        selector = pod.get("nodeSelector") or {}
        for key, value in (spec.get("nodeLabels") or {}).items():
            if key in selector and selector[key] != value:
                return f"flavor {flavor_name} doesn't match node affinity"
        for taint in spec.get("nodeTaints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(pod.get("tolerations"), taint):
                return f"untolerated taint {{{taint['key']}: {taint.get('value', '')}}} in flavor {flavor_name}"
        return None

    def _assign(self, cq: dict, wl: dict, usage: dict) -> tuple[dict | None, str, str]:
        """(usage by (flavor, resource), "", "") if it fits now; else (None, Kueue's reason, Kueue's message)."""
        requests = _requests(wl)
        template = wl["spec"]["podSets"][0]["template"]
        reasons: list[str] = []
        never = False
        fit: dict[tuple[str, str], Decimal] = {}
        groups = cq["spec"].get("resourceGroups") or []
        for res in sorted(requests):
            if not any(res in g.get("coveredResources", []) for g in groups):
                reasons.append(f"resource {res} unavailable in ClusterQueue")
                never = True
        for group in groups:
            wanted = {r: v for r, v in requests.items() if r in group.get("coveredResources", [])}
            if not wanted:
                continue
            chosen, group_reasons, group_never = None, [], True
            for flavor in group["flavors"]:
                misfit = self._flavor_misfit(flavor["name"], template)
                if misfit:
                    group_reasons.append(misfit)
                    continue
                quotas = {r["name"]: parse_quantity(r["nominalQuota"]) for r in flavor["resources"]}
                short, flavor_never = [], False
                for res, amount in sorted(wanted.items()):
                    quota, used = quotas.get(res, Decimal(0)), usage.get((flavor["name"], res), Decimal(0))
                    if amount > quota:
                        flavor_never = True
                        short.append(f"insufficient quota for {res} in flavor {flavor['name']}, previously considered "
                                     f"podsets requests (0) + current podset request ({quantity(res, amount)}) > "
                                     f"maximum capacity ({quantity(res, quota)})")
                    elif used + amount > quota:
                        short.append(f"insufficient unused quota for {res} in flavor {flavor['name']}, "
                                     f"{quantity(res, used + amount - quota)} more needed")
                if not short:
                    chosen = {(flavor["name"], r): v for r, v in wanted.items()}
                    break
                group_never = group_never and flavor_never
                group_reasons += short
            if chosen is None:
                reasons += group_reasons
                never = never or group_never
            else:
                fit.update(chosen)
        if reasons:
            message = f"couldn't assign flavors to pod set {POD_SET}: " + ", ".join(sorted(reasons))
            return None, "ExceedsMaxQuota" if never else "WaitingForQuota", message
        return fit, "", ""

    def _refuse(self, wl: dict, reason: str, message: str) -> None:
        changed = _set_cond(wl, "QuotaReserved", "False", reason, message)
        changed |= _set_cond(wl, "Admitted", "False", "NoReservation", "The workload has no reservation")
        if changed:
            self.store.replace(wl)

    def _admit_workload(self, cq: dict, wl: dict, fit: dict[tuple[str, str], Decimal]) -> None:
        ps = wl["spec"]["podSets"][0]
        wl.setdefault("status", {})["admission"] = {"clusterQueue": cq["metadata"]["name"], "podSetAssignments": [{
            "name": ps["name"], "count": ps.get("count", 1),
            "flavors": {res: flavor for flavor, res in fit},
            "resourceUsage": {res: quantity(res, amount) for (_, res), amount in fit.items()}}]}
        _set_cond(wl, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cq['metadata']['name']}")
        _set_cond(wl, "Admitted", "True", "Admitted", "The workload is admitted")
        self.store.replace(wl)
        owner = next(r for r in wl["metadata"]["ownerReferences"] if r["kind"] == "Job")
        job = self.store.find("Job", wl["metadata"]["namespace"], owner["name"])
        if job is None:
            return
        pod = job["spec"]["template"].setdefault("spec", {})
        for flavor_name in sorted({f for f, _ in fit}):
            flavor = self.store.find("ResourceFlavor", "", flavor_name) or {}
            pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **(flavor.get("spec", {}).get("nodeLabels") or {})}
            pod["tolerations"] = (pod.get("tolerations") or []) + list(flavor.get("spec", {}).get("tolerations") or [])
            if not pod["tolerations"]:
                pod.pop("tolerations")
            if not pod["nodeSelector"]:
                pod.pop("nodeSelector")
        job["spec"]["suspend"] = False
        self.store.replace(job)

    def _unroutable(self) -> None:
        """Workloads whose LocalQueue, or its ClusterQueue, does not exist: Misconfigured."""
        for wl in self.store.list("Workload"):
            if not self._pending(wl):
                continue
            queue = wl["spec"].get("queueName")
            lq = self.store.find("LocalQueue", wl["metadata"]["namespace"], queue) if queue else None
            if lq is None:
                self._refuse(wl, "Misconfigured", f"LocalQueue {queue} doesn't exist")
            elif self.store.find("ClusterQueue", "", lq["spec"].get("clusterQueue", "")) is None:
                self._refuse(wl, "Misconfigured", f"ClusterQueue {lq['spec'].get('clusterQueue')} doesn't exist")

    # --- status ------------------------------------------------------------------------------------
    def _queue_status(self) -> None:
        workloads = self.store.list("Workload")
        local_of = {(lq["metadata"]["namespace"], lq["metadata"]["name"]): lq for lq in self.store.list("LocalQueue")}

        def counts(mine: list[dict]) -> dict:
            live = [w for w in mine if not _true(w, "Finished")]
            return {"pendingWorkloads": sum(1 for w in live if not _true(w, "QuotaReserved")),
                    "reservingWorkloads": sum(1 for w in live if _true(w, "QuotaReserved")),
                    "admittedWorkloads": sum(1 for w in live if _true(w, "Admitted"))}

        for cq in self.store.list("ClusterQueue"):
            name = cq["metadata"]["name"]
            mine = [w for w in workloads if (lq := local_of.get((w["metadata"]["namespace"], w["spec"].get("queueName"))))
                    and lq["spec"].get("clusterQueue") == name]
            used: dict[str, dict[str, Decimal]] = {}
            for w in mine:
                if _true(w, "QuotaReserved") and not _true(w, "Finished"):
                    for ps in w["status"]["admission"]["podSetAssignments"]:
                        for res, flavor in ps["flavors"].items():
                            used.setdefault(flavor, {})[res] = used.get(flavor, {}).get(res, Decimal(0)) + \
                                parse_quantity(ps["resourceUsage"][res])
            usage = [{"name": f["name"], "resources": [
                {"name": r["name"], "total": quantity(r["name"], used.get(f["name"], {}).get(r["name"], Decimal(0)))}
                for r in f["resources"]]} for g in cq["spec"].get("resourceGroups") or [] for f in g["flavors"]]
            self._write_status(cq, {**counts(mine), "flavorsReservation": usage, "flavorsUsage": usage},
                               "Ready", "Can admit new workloads")
        for (ns, name), lq in local_of.items():
            mine = [w for w in workloads if w["metadata"]["namespace"] == ns and w["spec"].get("queueName") == name]
            ok = self.store.find("ClusterQueue", "", lq["spec"].get("clusterQueue", "")) is not None
            self._write_status(lq, counts(mine), "Ready" if ok else "ClusterQueueDoesNotExist",
                               "Can submit new workloads to localQueue" if ok else "Can't submit new workloads to clusterQueue")

    def _write_status(self, obj: dict, fields: dict, reason: str, message: str) -> None:
        before = copy.deepcopy(obj.get("status"))
        obj.setdefault("status", {}).update(fields)
        _set_cond(obj, "Active", "True" if reason == "Ready" else "False", reason, message)
        if obj["status"] != before:
            self.store.replace(obj)
