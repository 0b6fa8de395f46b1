"""The other control-plane loops: scheduler, garbage collector, TTL-after-finished, cluster DNS.

- ``Scheduler`` (kube-scheduler's filter step): a pod without ``nodeName`` is bound to the first
  node, by name, where it fits: the sum of ``requests`` (cpu, memory, any extended resource) of
  the non-terminal pods already bound there plus its own stays within the node's
  ``allocatable``, its ``nodeSelector`` matches the node's labels, and it tolerates the node's
  ``NoSchedule``/``NoExecute`` taints. A pod that fits nowhere gets ``PodScheduled=False``,
  reason ``Unschedulable``, with the real message shape (``0/1 nodes are available: 1
  Insufficient cpu. ...``) and is retried each round. Higher ``priority`` goes first.
  Fault injection: ``hold(seconds)`` delays every binding. Cut: no scoring (first fit), no
  preemption, no affinity/topology spread, no Kueue.
- ``GarbageCollector``: deletes objects whose owner (by ``ownerReferences[].uid``) no longer
  exists (background propagation) and finishes ``foregroundDeletion``; like the pod GC, it fails
  and removes unscheduled pods that are being deleted.
- ``TtlController``: deletes a finished Job ``ttlSecondsAfterFinished`` after its
  ``Complete``/``Failed`` condition (Background propagation: its pods go with it).
- ``Dns``: what CoreDNS answers for the objects here, written as the ``/etc/hosts`` every
  container gets: ``<hostname>.<subdomain>[.<ns>.svc[.cluster.local]]`` for a pod whose subdomain
  names a headless Service that selects it (not-ready pods only with
  ``publishNotReadyAddresses``), each Service's ``<svc>.<ns>.svc...`` name, and each pod's own
  hostname, all at 127.0.0.1 (every pod here shares one network namespace). The short forms
  that resolv.conf's search path gives in a pod are listed explicitly. The file is rewritten in
  place so bind mounts see the change.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from kubernetes.utils import parse_quantity

from tests.k8s_standin.admission import pod_amounts
from tests.k8s_standin.jobs import finished
from tests.k8s_standin.store import ApiError, Store, matches, now

CLUSTER_DOMAIN = "cluster.local"


def _terminal(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def tolerates(tolerations: list[dict] | None, taint: dict) -> bool:
    """Whether a pod with these tolerations may run on a node with this taint (the scheduler's and Kueue's rule)."""
    for t in tolerations or []:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator", "Equal") == "Exists" and t.get("key") in (None, "", taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value") == taint.get("value"):
            return True
    return False


class Scheduler:
    def __init__(self, store: Store, bind) -> None:
        self.store, self.bind = store, bind
        self.hold_until = 0.0

    def hold(self, seconds: float) -> None:
        self.hold_until = time.monotonic() + seconds

    def sync(self) -> None:
        if time.monotonic() < self.hold_until:
            return
        pods = [p for p in self.store.list("Pod") if not p["spec"].get("nodeName")
                and not p["metadata"].get("deletionTimestamp") and not _terminal(p)]
        pods.sort(key=lambda p: (-p["spec"].get("priority", 0), p["metadata"]["creationTimestamp"]))
        nodes = self.store.list("Node")
        for pod in pods:
            reasons: dict[str, int] = {}
            for node in nodes:
                why = self._misfit(pod, node)
                if why is None:
                    self.bind(pod["metadata"]["namespace"], pod["metadata"]["name"], node["metadata"]["name"])
                    break
                for w in why:
                    reasons[w] = reasons.get(w, 0) + 1
            else:
                parts = ", ".join(f"{n} {w}" for w, n in sorted(reasons.items()))
                msg = (f"0/{len(nodes)} nodes are available: {parts}. preemption: 0/{len(nodes)} nodes are "
                       f"available: {len(nodes)} No preemption victims found for incoming pod.")
                conds = pod.setdefault("status", {}).setdefault("conditions", [])
                old = next((c for c in conds if c["type"] == "PodScheduled"), None)
                if old is None or old.get("message") != msg:
                    pod["status"]["phase"] = "Pending"
                    pod["status"]["conditions"] = [c for c in conds if c["type"] != "PodScheduled"] + [
                        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg,
                         "lastTransitionTime": now()}]
                    self.store.replace(pod)

    def _misfit(self, pod: dict, node: dict) -> list[str] | None:
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (pod["spec"].get("nodeSelector") or {}).items()):
            return ["node(s) didn't match Pod's node affinity/selector"]
        for taint in node.get("spec", {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(pod["spec"].get("tolerations"), taint):
                return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
        allocatable = node.get("status", {}).get("allocatable") or {}
        used: dict[str, float] = {"pods": 0}
        for other in self.store.list("Pod"):
            if other["spec"].get("nodeName") == node["metadata"]["name"] and not _terminal(other):
                used["pods"] += 1
                for k, v in pod_amounts(other, "requests").items():
                    used[k] = used.get(k, 0) + v
        want = {**pod_amounts(pod, "requests"), "pods": 1}
        short = [f"Insufficient {k}" if k != "pods" else "Too many pods" for k, v in sorted(want.items())
                 if v and used.get(k, 0) + v > float(parse_quantity(allocatable.get(k, "0")))]
        return short or None


class GarbageCollector:
    def __init__(self, store: Store) -> None:
        self.store = store

    def sync(self) -> None:
        uids = {o["metadata"]["uid"] for o in self.store.objects.values()}
        for obj in list(self.store.objects.values()):
            meta = obj["metadata"]
            refs = meta.get("ownerReferences") or []
            if refs and not any(r["uid"] in uids for r in refs) and not meta.get("deletionTimestamp"):
                self._delete(obj)
            if "foregroundDeletion" in (meta.get("finalizers") or []) and meta.get("deletionTimestamp"):
                deps = [d for d in self.store.objects.values()
                        if any(r["uid"] == meta["uid"] for r in d["metadata"].get("ownerReferences") or [])]
                for d in deps:
                    if not d["metadata"].get("deletionTimestamp"):
                        self._delete(d)
                if not deps:
                    meta["finalizers"] = [f for f in meta["finalizers"] if f != "foregroundDeletion"]
                    self.store.replace(obj)
            if obj["kind"] == "Pod" and meta.get("deletionTimestamp") and not obj["spec"].get("nodeName") \
                    and meta.get("deletionGracePeriodSeconds", 0) == 0 and not _terminal(obj) \
                    and (obj["kind"], meta.get("namespace", ""), meta["name"]) in self.store.objects:
                obj.setdefault("status", {})["phase"] = "Failed"
                self.store.replace(obj)

    def _delete(self, obj: dict) -> None:
        try:
            self.store.delete(obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        except ApiError:
            pass


class TtlController:
    def __init__(self, store: Store) -> None:
        self.store = store

    def sync(self) -> None:
        for job in self.store.list("Job"):
            ttl = job["spec"].get("ttlSecondsAfterFinished")
            if ttl is None or not finished(job) or job["metadata"].get("deletionTimestamp"):
                continue
            cond = next(c for c in job["status"]["conditions"] if c["type"] in ("Complete", "Failed") and c["status"] == "True")
            at = dt.datetime.strptime(cond["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
            if (dt.datetime.now(dt.timezone.utc) - at).total_seconds() >= ttl:
                self.store.delete("Job", job["metadata"]["namespace"], job["metadata"]["name"])  # Background


class Dns:
    """The cluster's DNS as one ``/etc/hosts`` every container mounts: Services, headless Services' pod names
    (``<hostname>.<subdomain>...``) and pod hostnames, each to its pod's ``status.podIP``.

    ``unassigned``: the address of a name whose pod has none yet; 127.0.0.1 when every pod shares this
    machine's network (bwrap), None when pods have their own addresses (the name is left out until then).
    A name held by a terminating pod and its replacement (an evicted rank's index) goes to the replacement.
    """

    def __init__(self, store: Store, hosts_file: Path, unassigned: str | None = "127.0.0.1") -> None:
        self.store, self.hosts_file, self.unassigned = store, hosts_file, unassigned
        self.hosts_file.touch()
        self._last = ""

    def names(self) -> dict[str, str]:
        out: dict[str, str] = {}
        pods = sorted((p for p in self.store.list("Pod") if not _terminal(p)),
                      key=lambda p: not p["metadata"].get("deletionTimestamp"))  # terminating first: overridden

        def add(names: list[str], pod: dict | None) -> None:
            ip = ((pod or {}).get("status") or {}).get("podIP") or self.unassigned
            if ip:
                out.update(dict.fromkeys(names, ip))

        for svc in self.store.list("Service"):
            ns, name, spec = svc["metadata"]["namespace"], svc["metadata"]["name"], svc.get("spec", {})
            svc_names = [f"{name}.{ns}.svc.{CLUSTER_DOMAIN}", f"{name}.{ns}.svc", f"{name}.{ns}", name]
            if spec.get("clusterIP") != "None" or not spec.get("selector"):
                add(svc_names, None)
                continue
            members = []
            for pod in pods:
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))
                if (pod["metadata"]["namespace"] == ns and pod["spec"].get("subdomain") == name
                        and pod["spec"].get("hostname") and matches(pod["metadata"].get("labels"),
                                                                    [(k, "=", {v}) for k, v in spec["selector"].items()])
                        and (ready or spec.get("publishNotReadyAddresses"))):
                    host = pod["spec"]["hostname"]
                    add([f"{host}.{name}.{ns}.svc.{CLUSTER_DOMAIN}", f"{host}.{name}.{ns}.svc", f"{host}.{name}"], pod)
                    members.append(pod)
            add(svc_names, members[-1] if members else None)  # a headless name: one of its pods' addresses
        for pod in pods:
            add([pod["spec"].get("hostname") or pod["metadata"]["name"][:63]], pod)
        return out

    def sync(self) -> None:
        text = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + "".join(
            f"{ip}\t{n}\n" for n, ip in sorted(self.names().items()))
        if text != self._last:
            with self.hosts_file.open("r+") as f:  # in place: containers bind-mount this inode
                f.write(text)
                f.truncate()
            self._last = text
