"""Watches and API discovery, as kube-apiserver serves them to informers and operators.

Who needs them: the Prefect kubernetes worker's event observer (kopf, in prefect-kubernetes)
discovers the resources it handles (``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>/<version>``),
then lists and watches pods and Jobs in its namespace with a label selector. temper itself polls.

Watch semantics imitated (``?watch=true`` on a collection, a stream of JSON lines
``{"type": ..., "object": ...}``):

- ``resourceVersion`` unset or ``"0"``: "get state and start at most recent": a synthetic ADDED
  for every object that matches now, then the changes after it;
- ``resourceVersion=N``: every change after revision N, from the store's bounded history; a
  revision older than the history answers one ``ERROR`` event with a 410 ``Expired`` Status
  ("too old resource version"), which makes clients re-list, as after etcd compaction;
- ``labelSelector``/``fieldSelector`` filter the events by the object as written;
- ``allowWatchBookmarks``: a BOOKMARK with the current revision about once a second when idle;
- ``timeoutSeconds``: the server ends the stream (default: 30 to 60 minutes there, 30 here).

Cut: an object modified so that it stops matching a selector is not sent as DELETED to that
watcher (the real server does); no ``sendInitialEvents``/streaming lists; no discovery of
preferred versions beyond the one version each group has here.
"""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from tests.k8s_standin.store import KINDS, ApiError, Kind, Store, matches, parse_selector

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _resources(group: str, version: str) -> list[dict]:
    return [{"name": k.plural, "singularName": k.kind.lower(), "namespaced": k.namespaced, "kind": k.kind,
             "verbs": VERBS} for k in KINDS if (k.group, k.version) == (group, version)]


async def api_versions(request):
    """``/api``: the core group's versions (APIVersions)."""
    return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{request.host}"}]})


async def api_groups(request):
    """``/apis``: the named groups and their versions (APIGroupList)."""
    groups = sorted({(k.group, k.version) for k in KINDS if k.group})
    return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
         "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups]})


async def api_resources(request):
    """``/api/v1``, ``/apis/<group>/<version>``: the resources of one group version (APIResourceList)."""
    group, version = request.match_info.get("group", ""), request.match_info["version"]
    resources = _resources(group, version)
    if not resources:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                              "groupVersion": f"{group}/{version}" if group else version, "resources": resources})


def _line(event: str, obj: dict) -> bytes:
    return (json.dumps({"type": event, "object": obj}) + "\n").encode()


async def serve_watch(request, store: Store, kind: Kind, ns: str | None, field_match) -> web.StreamResponse:
    """Stream the changes of ``kind`` (in ``ns``, or all namespaces) as the watch API does."""
    reqs = parse_selector(request.query.get("labelSelector"))
    fields = request.query.get("fieldSelector")
    timeout = float(request.query.get("timeoutSeconds") or 1800)
    bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1")

    def wanted(obj: dict) -> bool:
        meta = obj["metadata"]
        return (obj["kind"] == kind.kind and (ns is None or meta.get("namespace", "") == ns)
                and matches(meta.get("labels"), reqs) and field_match(obj, fields))

    since = request.query.get("resourceVersion")
    if since not in (None, "", "0") and not since.isdigit():
        raise ApiError(400, "BadRequest", f"invalid resource version: {since!r}")
    resp = web.StreamResponse(headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    await resp.prepare(request)
    if since in (None, "", "0"):
        last = store.last_rv
        for obj in store.list(kind.kind, ns):
            if wanted(obj):
                await resp.write(_line("ADDED", obj))
    else:
        last = int(since)
        if last < store.compacted_rv:
            await resp.write(_line("ERROR", {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                             "message": f"too old resource version: {last} ({store.compacted_rv})",
                                             "reason": "Expired", "code": 410}))
            await resp.write_eof()
            return resp
    end, marked = time.monotonic() + timeout, time.monotonic()
    while time.monotonic() < end:
        if request.transport is None or request.transport.is_closing():
            return resp  # the client went away
        for rv, event, obj in [e for e in store.history if e[0] > last]:
            last = rv
            if wanted(obj):
                await resp.write(_line(event, obj))
                marked = time.monotonic()
        if bookmarks and time.monotonic() - marked > 1:
            await resp.write(_line("BOOKMARK", {"kind": kind.kind, "apiVersion": kind.api_version,
                                                "metadata": {"resourceVersion": str(max(last, store.last_rv))}}))
            marked = time.monotonic()
        await asyncio.sleep(0.1)
    await resp.write_eof()
    return resp

