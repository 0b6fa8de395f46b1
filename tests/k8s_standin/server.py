"""The REST surface of kube-apiserver over HTTP (aiohttp), as the official client calls it.

Paths: ``/api/v1/...`` (core) and ``/apis/<group>/<version>/...`` with the usual shapes:
collection (GET list with ``labelSelector``, POST create), item (GET, PUT, PATCH, DELETE),
and the subresources temper uses: ``status`` (GET/PUT/PATCH), ``log`` (``container``,
``follow``, ``tailLines``), ``exec`` (websocket, see ``exec_ws``), ``eviction`` (policy/v1),
``binding``. Errors are ``metav1.Status`` documents with the real reasons and codes, so the
client raises ``ApiException`` with the same ``status``/``reason``/``body`` a cluster gives.

Imitated semantics worth naming: PUT on an object ignores its ``status`` (status subresource)
and is refused on a stale ``resourceVersion``; DELETE takes ``DeleteOptions`` (body or query)
with ``propagationPolicy`` (Jobs default to Orphan in batch/v1, everything else Background;
Orphan strips the owner reference from dependents, Background/Foreground leave them to the
garbage collector); PATCH takes merge-patch and strategic-merge-patch (applied as a JSON merge
patch: lists are replaced, not merged by key, a simplification) and JSON patch.
An eviction adds the ``DisruptionTarget`` condition (reason ``EvictionByEvictionAPI``) to the
pod's status, then deletes it gracefully, as the eviction subresource does since 1.26. There
are no PodDisruptionBudgets, so an eviction is never refused with 429.

Watches and discovery (``?watch=true``, ``/api``, ``/apis``, ``/api/v1``...) are in ``watch``.

Cut: no authentication/authorization, ``fieldSelector`` over any path (not only the
fields the real server indexes), no pagination
(``limit``/``continue`` are ignored: one page), no discovery beyond ``/version``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonpatch
from aiohttp import web

from tests.k8s_standin import admission, kueue, watch
from tests.k8s_standin.store import BY_PATH, ApiError, Kind, Store, now

STATUS_KINDS = {"Pod", "Job", "Service", "Namespace", "Node", "ResourceQuota", *kueue.KINDS}


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, val in patch.items():
        if val is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), val)
    return out


def field_match(obj: dict, selector: str | None) -> bool:
    """``fieldSelector``: ``path=value``/``path==value``/``path!=value`` terms over dotted paths
    (``metadata.name``, ``status.phase``, ``involvedObject.name``, ``spec.nodeName``). The real
    server allows only a per-kind list of fields; this one allows any path."""
    for term in filter(None, (selector or "").split(",")):
        neg = "!=" in term
        path, _, want = term.partition("!=" if neg else "=")
        value = obj
        for part in path.strip().split("."):
            value = value.get(part) if isinstance(value, dict) else None
        got = "" if value is None else str(value)
        if (got == want.lstrip("=").strip()) == neg:
            return False
    return True


def success(name: str, kind: Kind, obj: dict | None = None) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "kind": kind.plural, "uid": (obj or {}).get("metadata", {}).get("uid")}}


class ApiServer:
    """Routes requests to the store; ``kubelet`` serves logs and exec (as the real one does)."""

    def __init__(self, store: Store, kubelet) -> None:
        self.store, self.kubelet = store, kubelet
        self.app = web.Application(middlewares=[self._errors], client_max_size=64 << 20)
        self.app.router.add_get("/version", self.version)
        for slash in ("", "/"):  # clients ask for both (the official Python client with the slash)
            self.app.router.add_get("/api" + slash, watch.api_versions)
            self.app.router.add_get("/apis" + slash, watch.api_groups)
        self.app.router.add_get("/api/{version}", watch.api_resources)
        self.app.router.add_get("/apis/{group}/{version}", watch.api_resources)
        self.app.router.add_route("*", "/api/{version}/{tail:.*}", self.core)
        self.app.router.add_route("*", "/apis/{group}/{version}/{tail:.*}", self.grouped)

    @web.middleware
    async def _errors(self, request, handler):
        try:
            return await handler(request)
        except ApiError as e:
            return web.json_response(e.status(), status=e.code)

    async def version(self, request):
        return web.json_response({"major": "1", "minor": "33", "gitVersion": "v1.33.0-temper-standin",
                                  "platform": "linux/amd64"})

    async def core(self, request):
        return await self._route(request, "", request.match_info["version"], request.match_info["tail"])

    async def grouped(self, request):
        return await self._route(request, request.match_info["group"], request.match_info["version"],
                                 request.match_info["tail"])

    # --- routing ---------------------------------------------------------------------------------
    def _kind(self, group: str, version: str, plural: str) -> Kind:
        kind = BY_PATH.get((group, version, plural))
        if kind is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return kind

    async def _route(self, request, group: str, version: str, tail: str):
        parts = [p for p in tail.split("/") if p]
        if not parts and request.method == "GET":  # /api/v1/, /apis/<group>/<version>/
            return await watch.api_resources(request)
        ns = None
        if len(parts) >= 3 and parts[0] == "namespaces" and (group, version, parts[2]) in BY_PATH:
            ns, parts = parts[1], parts[2:]
        if not parts:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kind = self._kind(group, version, parts[0])
        if kind.namespaced and ns is None and len(parts) > 1:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = ns or ""
        if len(parts) == 1:
            return await self._collection(request, kind, ns)
        name, sub = parts[1], (parts[2] if len(parts) > 2 else None)
        if sub is None:
            return await self._item(request, kind, ns, name)
        return await self._subresource(request, kind, ns, name, sub)

    async def _body(self, request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body is not an object")
        return body

    # --- collections -----------------------------------------------------------------------------
    async def _collection(self, request, kind: Kind, ns: str):
        if request.method == "GET":
            if request.query.get("watch") in ("true", "1"):
                return await watch.serve_watch(request, self.store, kind, ns or None, field_match)
            items = self.store.list(kind.kind, ns or None, request.query.get("labelSelector"))
            items = [o for o in items if field_match(o, request.query.get("fieldSelector"))]
            return web.json_response({"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                                      "metadata": {"resourceVersion": self.store.resource_version()},
                                      "items": items})
        if request.method == "POST":
            body = await self._body(request)
            if body.get("kind") not in (None, kind.kind):
                raise ApiError(400, "BadRequest", f"the body is a {body.get('kind')}, not a {kind.kind}")
            obj = self.store.create(kind.kind, ns, body, admit=self._admitter(kind.kind, ns))
            if kind.kind == "Namespace":
                obj.setdefault("status", {})["phase"] = "Active"
                self.store.create("ServiceAccount", obj["metadata"]["name"], {"metadata": {"name": "default"}})
            return web.json_response(obj, status=201)
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported on a collection here")

    def _admitter(self, kind: str, ns: str):
        def admit(obj: dict) -> None:
            if ns:
                admission.check_object_count(self.store, ns, kind, obj["metadata"]["name"])
            if kind == "Pod":
                admission.admit_pod(self.store, ns, obj)
            elif kind == "Job":
                admission.admit_job(obj)
            elif kind == "Service":
                obj.setdefault("spec", {}).setdefault("type", "ClusterIP")
            elif kind in kueue.KINDS:
                kueue.admit(self.store, obj)
        return admit

    # --- items -----------------------------------------------------------------------------------
    async def _item(self, request, kind: Kind, ns: str, name: str):
        if request.method == "GET":
            return web.json_response(self.store.get(kind.kind, ns, name))
        if request.method == "PUT":
            body = await self._body(request)
            current = self.store.get(kind.kind, ns, name)
            body.setdefault("metadata", {}).update(name=name, **({"namespace": ns} if kind.namespaced else {}))
            body["kind"], body["apiVersion"] = kind.kind, kind.api_version
            if kind.kind in STATUS_KINDS:
                body["status"] = current.get("status", {})
            return web.json_response(self.store.replace(body, body["metadata"].get("resourceVersion")))
        if request.method == "PATCH":
            return web.json_response(await self._patch(request, kind, ns, name, status=False))
        if request.method == "DELETE":
            return web.json_response(await self._delete(request, kind, ns, name))
        raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported here")

    async def _patch(self, request, kind: Kind, ns: str, name: str, status: bool) -> dict:
        current = self.store.get(kind.kind, ns, name)
        ctype = request.content_type
        raw = await request.json()
        if ctype == "application/json-patch+json":
            try:
                patched = jsonpatch.apply_patch(current, raw)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise ApiError(422, "Invalid", f"the JSON patch cannot be applied: {e}") from e
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            patched = merge_patch(current, raw)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {ctype}")
        if kind.kind in STATUS_KINDS:
            keep = "spec" if status else "status"
            patched[keep] = current.get(keep)
            if patched[keep] is None:
                patched.pop(keep)
        patched["metadata"]["name"] = name
        return self.store.replace(patched, (raw.get("metadata") or {}).get("resourceVersion") if isinstance(raw, dict) else None)

    async def _delete(self, request, kind: Kind, ns: str, name: str) -> dict:
        opts = {}
        if request.can_read_body:
            text = await request.text()
            opts = json.loads(text) if text.strip() else {}
        grace = opts.get("gracePeriodSeconds", request.query.get("gracePeriodSeconds"))
        policy = opts.get("propagationPolicy") or request.query.get("propagationPolicy") or (
            "Orphan" if kind.kind == "Job" else "Background")
        obj = self.store.get(kind.kind, ns, name)
        uid = obj["metadata"]["uid"]
        if policy == "Orphan":
            for dep in list(self.store.objects.values()):
                refs = dep["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    dep["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                    self.store.replace(dep)
        elif policy == "Foreground":
            obj["metadata"].setdefault("finalizers", []).append("foregroundDeletion")
        obj = self.store.delete(kind.kind, ns, name, None if grace is None else int(grace))
        gone = self.store.find(kind.kind, ns, name) is None
        # these registries answer with the deleted object (ReturnDeletedObject), others with a Status
        returns_object = ("Pod", "Service", "ResourceQuota", "ServiceAccount")
        return success(name, kind, obj) if gone and kind.kind not in returns_object else obj

    # --- subresources ----------------------------------------------------------------------------
    async def _subresource(self, request, kind: Kind, ns: str, name: str, sub: str):
        if sub == "status":
            if request.method == "GET":
                return web.json_response(self.store.get(kind.kind, ns, name))
            if request.method == "PATCH":
                return web.json_response(await self._patch(request, kind, ns, name, status=True))
            if request.method == "PUT":
                body, current = await self._body(request), self.store.get(kind.kind, ns, name)
                updated = {**current, "status": body.get("status", {})}
                return web.json_response(self.store.replace(updated, (body.get("metadata") or {}).get("resourceVersion")))
        if kind.kind == "Pod":
            if sub == "log" and request.method == "GET":
                return await self._log(request, ns, name)
            if sub == "exec":
                from tests.k8s_standin.exec_ws import serve_exec

                return await serve_exec(request, self.kubelet, self.store.get("Pod", ns, name))
            if sub == "eviction" and request.method == "POST":
                return web.json_response(await self._evict(request, ns, name), status=201)
            if sub == "binding" and request.method == "POST":
                body = await self._body(request)
                self.bind(ns, name, body.get("target", {}).get("name", ""))
                return web.json_response(success(name, kind), status=201)
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({kind.plural}/{sub})")

    def bind(self, ns: str, name: str, node: str) -> dict:
        """pods/binding: set ``spec.nodeName`` once (a second binding is a 409 Conflict)."""
        pod = self.store.get("Pod", ns, name)
        if pod["spec"].get("nodeName"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} '
                           f"is already assigned to node \"{pod['spec']['nodeName']}\"", "pods", name)
        pod["spec"]["nodeName"] = node
        conds = [c for c in pod.setdefault("status", {}).get("conditions", []) if c["type"] != "PodScheduled"]
        pod["status"]["conditions"] = conds + [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}]
        return self.store.replace(pod)

    async def _evict(self, request, ns: str, name: str) -> dict:
        body = await self._body(request)
        pod = self.store.get("Pod", ns, name)
        grace = (body.get("deleteOptions") or {}).get("gracePeriodSeconds")
        if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            conds = [c for c in pod.setdefault("status", {}).get("conditions", []) if c["type"] != "DisruptionTarget"]
            pod["status"]["conditions"] = conds + [{
                "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting", "lastTransitionTime": now()}]
            self.store.replace(pod)
        self.store.delete("Pod", ns, name, grace)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}

    async def _log(self, request, ns: str, name: str):
        pod = self.store.get("Pod", ns, name)
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = request.query.get("container") or (containers[0] if len(containers) == 1 else None)
        if container not in containers:
            raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}, choose one of: "
                           f"{containers}" if container is None else f"container {container} is not valid for pod {name}")
        path: Path | None = self.kubelet.log_path(pod, container)
        if path is None or not path.exists():
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: '
                           "ContainerCreating")
        follow = request.query.get("follow") in ("true", "1")
        tail = request.query.get("tailLines")
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        with path.open("rb") as f:
            if tail is not None:
                lines = f.read().splitlines(keepends=True)
                await resp.write(b"".join(lines[-int(tail):] if int(tail) else []))
            while True:
                chunk = f.read(65536)
                if chunk:
                    await resp.write(chunk)
                    continue
                if not follow or not self.kubelet.container_running(ns, name, container):
                    rest = f.read()  # what the process wrote between the last read and its exit
                    if rest:
                        await resp.write(rest)
                    break
                await asyncio.sleep(0.1)
        await resp.write_eof()
        return resp
