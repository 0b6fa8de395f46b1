"""A container's environment, resolved as the kubelet resolves it (both container runtimes use this).

Kubernetes order: ``envFrom`` Secrets/ConfigMaps, then ``env`` with ``$(VAR)`` expansion over earlier
values, ``valueFrom`` ``fieldRef`` downward-API fields (``metadata.name``, ``metadata.namespace``,
``metadata.uid``, ``metadata.labels['k']``, ``metadata.annotations['k']``, ``spec.nodeName``,
``spec.serviceAccountName``, ``status.podIP``, ``status.hostIP``), ``secretKeyRef`` and
``configMapKeyRef``. A missing source is ``ConfigError`` (CreateContainerConfigError, retried).
"""

from __future__ import annotations

import base64
import re

from tests.k8s_standin.store import Store

POD_IP = "127.0.0.1"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known vars are replaced, unknown left as is, ``$$`` -> ``$``."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


class ConfigError(Exception):
    """CreateContainerConfigError: the container cannot be set up (yet)."""


class ImageError(ConfigError):
    """ErrImagePull: the node does not have the image (nothing is pulled here)."""


def _field(pod: dict, path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": status.get("podIP", POD_IP), "status.hostIP": status.get("hostIP", POD_IP)}
    if path not in simple:
        raise ConfigError(f"unsupported fieldRef {path!r}")
    return simple[path]


def source(store: Store, kind: str, ns: str, name: str, optional: bool) -> dict[str, str] | None:
    """A Secret's (decoded) or ConfigMap's data; None for a missing optional one."""
    obj = store.find(kind, ns, name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind.lower()} "{name}" not found')
    data = dict(obj.get("data") or {})
    if kind == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        data.update(obj.get("stringData") or {})
    return data


def resolve_env(store: Store, pod: dict, c: dict, base: dict[str, str]) -> dict[str, str]:
    """Container ``c``'s environment over ``base`` (what the stand-in's bwrap images provide; empty for real images)."""
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for src in c.get("envFrom") or []:
        ref = src.get("secretRef") or src.get("configMapRef")
        kind = "Secret" if src.get("secretRef") else "ConfigMap"
        data = source(store, kind, ns, ref["name"], bool(ref.get("optional")))
        env.update({src.get("prefix", "") + k: v for k, v in (data or {}).items()})
    for var in c.get("env") or []:
        vf = var.get("valueFrom")
        if vf is None:
            env[var["name"]] = expand(var.get("value", ""), env)
        elif vf.get("fieldRef"):
            env[var["name"]] = _field(pod, vf["fieldRef"]["fieldPath"])
        elif vf.get("secretKeyRef") or vf.get("configMapKeyRef"):
            ref = vf.get("secretKeyRef") or vf.get("configMapKeyRef")
            kind = "Secret" if vf.get("secretKeyRef") else "ConfigMap"
            data = source(store, kind, ns, ref["name"], bool(ref.get("optional")))
            if data is not None and ref["key"] in data:
                env[var["name"]] = data[ref["key"]]
            elif not ref.get("optional"):
                raise ConfigError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
        else:
            raise ConfigError(f"env {var['name']}: valueFrom {sorted(vf)} is not supported by the stand-in")
    return env
