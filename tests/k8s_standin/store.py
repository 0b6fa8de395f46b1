"""The API server's storage: typed objects by kind, resourceVersion, labels, finalizers, deletion.

What it imitates (kube-apiserver + etcd, for the kinds temper touches):

- one monotonically increasing ``resourceVersion`` over all objects (etcd's revision), bumped on
  every write; ``uid``, ``creationTimestamp`` and ``generation`` set by the server;
- ``metadata.generateName``; create of an existing name -> 409 AlreadyExists; read/delete of a
  missing one -> 404 NotFound; a namespaced create in a namespace that does not exist -> 404
  (``namespaces "x" not found``); a namespace being deleted refuses creates (403 Forbidden);
- a replace carrying a stale ``resourceVersion`` -> 409 Conflict (optimistic concurrency);
- label selectors (equality ``=``/``==``/``!=``, ``in``/``notin``, existence ``k``/``!k``);
- graceful deletion: a pod bound to a node is first marked (``deletionTimestamp``,
  ``deletionGracePeriodSeconds``); the kubelet removes it once its processes are gone. Any object
  with ``metadata.finalizers`` stays until they are removed (the Job controller's
  ``batch.kubernetes.io/job-tracking`` finalizer relies on this);
- ``ownerReferences``: garbage collection of dependents is done by ``controllers.GarbageCollector``
  (background propagation), not here, as in Kubernetes.

Cut: no field validation against the OpenAPI schema (the client only sends fields its models
know), no defaulting beyond what the controllers read, no field managers / server-side apply,
a bounded ``watch`` history (``history``: the last ``HISTORY`` writes as ADDED/MODIFIED/DELETED
events, older resourceVersions answer 410 Gone as after etcd compaction; the controllers poll).
All calls run on the stand-in's event loop thread; there is no locking.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import re
import uuid
from collections import deque
from dataclasses import dataclass

HISTORY = 20000  # watch events kept (etcd keeps ~5 min of revisions by default)


class ApiError(Exception):
    """A failure the API server reports as a ``metav1.Status`` document."""

    def __init__(self, code: int, reason: str, message: str, kind: str = "", name: str = ""):
        super().__init__(message)
        self.code, self.reason, self.message, self.kind, self.name = code, reason, message, kind, name

    def status(self) -> dict:
        details = {"name": self.name, "kind": self.kind} if self.name else {}
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": details, "code": self.code}


@dataclass(frozen=True)
class Kind:
    kind: str
    group: str  # "" = core
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:  # how error messages name the resource: pods, jobs.batch
        return f"{self.plural}.{self.group}" if self.group else self.plural


KINDS = [
    Kind("Namespace", "", "v1", "namespaces", namespaced=False),
    Kind("Node", "", "v1", "nodes", namespaced=False),
    Kind("Pod", "", "v1", "pods"),
    Kind("Service", "", "v1", "services"),
    Kind("ServiceAccount", "", "v1", "serviceaccounts"),
    Kind("Secret", "", "v1", "secrets"),
    Kind("ConfigMap", "", "v1", "configmaps"),
    Kind("Event", "", "v1", "events"),
    Kind("ResourceQuota", "", "v1", "resourcequotas"),
    Kind("Job", "batch", "v1", "jobs"),
    Kind("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies"),
    Kind("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses", namespaced=False),
    Kind("RuntimeClass", "node.k8s.io", "v1", "runtimeclasses", namespaced=False),
    # Kueue's custom resources (tests/k8s_standin/kueue.py), served in v1beta2 only
    Kind("ResourceFlavor", "kueue.x-k8s.io", "v1beta2", "resourceflavors", namespaced=False),
    Kind("ClusterQueue", "kueue.x-k8s.io", "v1beta2", "clusterqueues", namespaced=False),
    Kind("LocalQueue", "kueue.x-k8s.io", "v1beta2", "localqueues"),
    Kind("Workload", "kueue.x-k8s.io", "v1beta2", "workloads"),
]
BY_PATH = {(k.group, k.version, k.plural): k for k in KINDS}
BY_NAME = {k.kind: k for k in KINDS}
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_SEL = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in parts + [cur] if p.strip()]


def parse_selector(selector: str | None) -> list[tuple]:
    """``labelSelector`` query string -> requirements; a malformed one is 400 BadRequest."""
    reqs = []
    for part in _split_selector(selector or ""):
        m = _SEL.match(part)
        if not m:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
        neg, key, op, val, setop, values = m.groups()
        if neg and (op or setop):
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
        if setop:
            reqs.append((key, setop, {v.strip() for v in values.split(",") if v.strip()}))
        elif op:
            reqs.append((key, "!=" if op == "!=" else "=", {val}))
        else:
            reqs.append((key, "!exists" if neg else "exists", set()))
    return reqs


def matches(labels: dict | None, reqs: list[tuple]) -> bool:
    labels = labels or {}
    for key, op, values in reqs:
        present, value = key in labels, labels.get(key)
        ok = {"=": present and value in values, "in": present and value in values,
              "!=": not present or value not in values, "notin": not present or value not in values,
              "exists": present, "!exists": not present}[op]
        if not ok:
            return False
    return True


class Store:
    """Objects as plain JSON dicts (camelCase, as on the wire), keyed by (kind, namespace, name)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}
        self._rv = itertools.count(1)
        self.last_rv = 0
        # (resourceVersion, ADDED/MODIFIED/DELETED, the object as written) for watches (watch.py)
        self.history: deque[tuple[int, str, dict]] = deque(maxlen=HISTORY)
        self.compacted_rv = 0  # watches from a resourceVersion below this get 410 Gone

    # --- reads ---------------------------------------------------------------------------------
    def get(self, kind: str, namespace: str, name: str) -> dict:
        obj = self.objects.get((kind, namespace if BY_NAME[kind].namespaced else "", name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{BY_NAME[kind].resource} "{name}" not found', kind.lower() + "s", name)
        return obj

    def find(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return self.get(kind, namespace, name)
        except ApiError:
            return None

    def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        reqs = parse_selector(selector)
        out = [o for (k, ns, _), o in self.objects.items()
               if k == kind and (namespace is None or ns == namespace) and matches(o["metadata"].get("labels"), reqs)]
        return sorted(out, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def resource_version(self) -> str:
        """The store's current revision (a list's ``metadata.resourceVersion``: watch from here)."""
        return str(self.last_rv)

    # --- writes --------------------------------------------------------------------------------
    def _bump(self, obj: dict) -> dict:
        self.last_rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self.last_rv)
        return obj

    def _record(self, event: str, obj: dict) -> None:
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0][0]
        self.history.append((int(obj["metadata"]["resourceVersion"]), event, copy.deepcopy(obj)))

    def create(self, kind: str, namespace: str, body: dict, admit=None) -> dict:
        """``admit(obj)`` runs once uid/name are set and may refuse (raise ApiError) or default fields."""
        k = BY_NAME[kind]
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name") or ""
        if not name:
            raise ApiError(422, "Invalid", f"{k.kind} is invalid: metadata.name: Required value", kind, name)
        if not DNS1123.match(name) or len(name) > 253:
            raise ApiError(422, "Invalid", f'{k.kind} "{name}" is invalid: metadata.name: Invalid value: '
                           f'"{name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric '
                           "characters, '-' or '.'", kind, name)
        if k.namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match "
                               "the namespace sent on the request")
            ns = self.find("Namespace", "", namespace)
            if ns is None:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found', "namespaces", namespace)
            if ns["metadata"].get("deletionTimestamp"):
                raise ApiError(403, "Forbidden", f'{k.resource} "{name}" is forbidden: unable to create new content '
                               f'in namespace {namespace} because it is being terminated', kind, name)
            meta["namespace"] = namespace
        else:
            namespace = ""
            meta.pop("namespace", None)
        key = (kind, namespace, name)
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'{k.resource} "{name}" already exists', k.plural, name)
        obj["kind"], obj["apiVersion"] = k.kind, k.api_version
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        for drop in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(drop, None)
        if admit is not None:
            admit(obj)
        self.objects[key] = self._bump(obj)
        self._record("ADDED", obj)
        return obj

    def replace(self, obj: dict, check_version: str | None = None) -> dict:
        """Store a whole object (update/PUT and the status subresource); stale version -> 409."""
        meta = obj["metadata"]
        current = self.get(obj["kind"], meta.get("namespace", ""), meta["name"])
        if check_version and check_version != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {BY_NAME[obj["kind"]].resource} '
                           f'"{meta["name"]}": the object has been modified; please apply your changes to the '
                           "latest version and try again", obj["kind"], meta["name"])
        for keep in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if keep in current["metadata"]:
                meta[keep] = current["metadata"][keep]
        if obj.get("spec") != current.get("spec"):
            meta["generation"] = current["metadata"].get("generation", 1) + 1
        self.objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = self._bump(obj)
        self._record("DELETED" if self._maybe_remove(obj) else "MODIFIED", obj)
        return obj

    def delete(self, kind: str, namespace: str, name: str, grace_s: int | None = None) -> dict:
        """Graceful for pods on a node; other objects go at once unless finalizers hold them."""
        obj = self.get(kind, namespace, name)
        meta = obj["metadata"]
        if kind == "Pod":
            spec = obj.get("spec", {})
            grace = spec.get("terminationGracePeriodSeconds", 30) if grace_s is None else grace_s
            terminal = obj.get("status", {}).get("phase") in ("Succeeded", "Failed")
            if spec.get("nodeName") and not terminal and grace > 0:
                if not meta.get("deletionTimestamp"):
                    meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = now(), grace
                else:  # a second delete may only shorten the grace period
                    meta["deletionGracePeriodSeconds"] = min(grace, meta["deletionGracePeriodSeconds"])
                self._bump(obj)
                self._record("MODIFIED", obj)
                return obj
            meta["deletionGracePeriodSeconds"] = 0
        meta.setdefault("deletionTimestamp", now())
        self._bump(obj)
        self._record("DELETED" if self._maybe_remove(obj) else "MODIFIED", obj)
        return obj

    def _maybe_remove(self, obj: dict) -> bool:
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return False
        if obj["kind"] == "Pod" and meta.get("deletionGracePeriodSeconds", 0) > 0:
            return False  # the kubelet confirms the processes are gone (delete with grace 0)
        return self.objects.pop((obj["kind"], meta.get("namespace", ""), meta["name"]), None) is not None
