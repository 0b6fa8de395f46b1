"""Validate custom objects against their CustomResourceDefinitions, as kube-apiserver does.

Kueue's objects (ClusterQueue, LocalQueue, ResourceFlavor, Workload) are not in the Kubernetes
OpenAPI schema ``kubernetes_validate`` ships, so they are checked against the CRDs Kueue itself
publishes. Those files are not part of this repository (they come from Kueue's repository, and
files of fetched repositories are kept outside temper): ``$TEMPER_KUEUE_CRDS``, by default
``../shared/kueue-crds`` next to the checkout. Without them, callers skip (tests) or store
objects unchecked (the stand-in), and say so.

What the API server does with a CRD's ``openAPIV3Schema``, and what is imitated here:
- the structural schema as JSON Schema (``jsonschema``): types, ``required``, ``enum``, ``pattern``
  (the quantity regex for int-or-string quantities), min/max, ``nullable``;
- strict field validation (kubectl's default ``--validate=strict``): an unknown field is an
  error, except under ``x-kubernetes-preserve-unknown-fields``;
- ``x-kubernetes-validations`` CEL rules, evaluated with cel-python (the CEL spec's Python
  implementation, not cel-go with Kubernetes' extension libraries); transition rules (those
  reading ``oldSelf``) are skipped, as on a create;
- ``metadata.name`` a DNS-1123 subdomain, and ``metadata.namespace`` present exactly when the
  CRD's scope is Namespaced.
Cut: defaulting, ``x-kubernetes-list-type`` uniqueness, ``maxProperties`` on maps of CEL cost.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

CRDS_ENV = "TEMPER_KUEUE_CRDS"
REPO = Path(__file__).resolve().parents[2]
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def crd_dir() -> Path:
    """Where Kueue's CRD files are looked for: ``$TEMPER_KUEUE_CRDS``, else ``<repo>/../shared/kueue-crds``."""
    return Path(os.environ.get(CRDS_ENV) or REPO.parent / "shared" / "kueue-crds")


@dataclass
class Crd:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    schema: dict  # openAPIV3Schema as strict JSON Schema
    raw: dict  # openAPIV3Schema as published (for the CEL rules)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def _strict(node: dict) -> dict:
    """Structural schema -> JSON Schema: unknown fields refused, ``nullable`` honoured, CRD keys dropped."""
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in ("nullable", "description")}
    if "properties" in node:
        out["properties"] = {k: _strict(v) for k, v in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(node["additionalProperties"])
    if "items" in node:
        out["items"] = _strict(node["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            out[key] = [_strict(s) for s in node[key]]
    if node.get("nullable"):
        out = {"anyOf": [{"type": "null"}, out]}
    return out


def load_crds(directory: Path | None = None) -> dict[tuple[str, str], Crd]:
    """Every served version of every CRD file in ``directory``, by (apiVersion, kind); {} if there are none."""
    directory = directory or crd_dir()
    found: dict[tuple[str, str], Crd] = {}
    for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
        for doc in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for ver in spec["versions"]:
                if not ver.get("served", True):
                    continue
                raw = ver["schema"]["openAPIV3Schema"]
                crd = Crd(spec["group"], ver["name"], spec["names"]["kind"], spec["names"]["plural"],
                          spec["scope"] == "Namespaced", _strict(raw), raw)
                found[(crd.api_version, crd.kind)] = crd
    return found


def _cel_errors(schema: dict, value, path: str) -> list[str]:
    """The ``x-kubernetes-validations`` rules ``value`` breaks, walking the schema alongside it."""
    import celpy

    errors = []
    if value is None:
        return errors
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" in rule["rule"]:
            continue  # a transition rule: only on update
        env = celpy.Environment()
        try:
            ok = env.program(env.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as e:  # e.g. a field the rule reads is absent
            errors.append(f"{path or '<root>'}: rule {rule['rule']!r} could not be evaluated: {e}")
            continue
        if not ok:
            errors.append(f"{path or '<root>'}: Invalid value: {rule.get('message') or rule['rule']}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                errors += _cel_errors(sub, value[key], f"{path}.{key}" if path else key)
        if isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                errors += _cel_errors(schema["additionalProperties"], item, f"{path}[{key}]")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += _cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def validate(doc: dict, crds: dict[tuple[str, str], Crd]) -> list[str]:
    """Every reason the API server (with these CRDs installed) would refuse ``doc``; [] if it is valid."""
    import jsonschema

    crd = crds.get((doc.get("apiVersion"), doc.get("kind")))
    if crd is None:
        return [f"no CRD serves {doc.get('kind')} in {doc.get('apiVersion')} (served: "
                f"{sorted(f'{v} {k}' for v, k in crds)})"]
    meta = doc.get("metadata") or {}
    errors = []
    if not DNS1123_SUBDOMAIN.match(meta.get("name") or "") or len(meta.get("name") or "") > 253:
        errors.append(f"metadata.name: Invalid value: {meta.get('name')!r}: not a lowercase RFC 1123 subdomain")
    if crd.namespaced != bool(meta.get("namespace")):
        errors.append(f"metadata.namespace: {crd.kind} is {'namespaced' if crd.namespaced else 'cluster-scoped'}"
                      f" but the object has {'no' if not meta.get('namespace') else 'a'} namespace")
    body = copy.deepcopy(doc)
    body.pop("metadata", None)  # ObjectMeta is the API server's, not the CRD's (schema says type: object)
    validator = jsonschema.Draft7Validator(crd.schema)
    for err in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "<root>"
        errors.append(f"{where}: {err.message}")
    if not errors:
        errors += _cel_errors(crd.raw, body, "")
    return errors
