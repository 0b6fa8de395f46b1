"""Model versions: the one resolver of a version reference, and the listing ``temper models list`` prints.

A reference is a version number (``3`` or ``v3``) or an alias (``champion``) of a given model,
or, spelled with the model, ``MODEL@ALIAS`` / ``MODEL/VERSION``. Every command and flow that
takes a version resolves it here, so the same words mean the same version and the errors list
what does exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from temper.core.tag_names import TAG_BASE_MODEL, TAG_GATE_PASSED
from temper.registry.store import RegistryError, aliases_of, client, registered_model, version_of
from temper.registry.tags import parse_eval_tags

_NUMBER = re.compile(r"v?(\d+)")


def all_versions(c: Any, model: str) -> list[Any]:
    """Every version of ``model``, oldest first."""
    return sorted(c.search_model_versions(f"name = '{model}'"), key=lambda mv: int(mv.version))


def resolve_version(c: Any, model: str, ref: str | int) -> Any:
    """``ref`` = a version number ('3', 'v3', 3) or an alias; the error lists what does exist."""
    # lazy: mlflow (1.6 s) would load at every `temper` start-up (commands/models.py imports this module)
    from mlflow.exceptions import MlflowException

    rm = registered_model(c, model)
    ref = str(ref)
    number = _NUMBER.fullmatch(ref)
    if number:
        try:
            return c.get_model_version(model, number.group(1))
        except MlflowException:
            known = ", ".join(version_of(mv) for mv in all_versions(c, model)) or "none"
            raise RegistryError(f"{model}: no version {number.group(1)} (versions: {known})") from None
    aliases = aliases_of(rm)
    if ref not in aliases:
        known = ", ".join(f"{a}->v{v}" for a, v in sorted(aliases.items())) or "none"
        raise RegistryError(f"{model}: no alias {ref!r} (aliases: {known})")
    return c.get_model_version(model, aliases[ref])


def split_ref(ref: str) -> tuple[str, str] | None:
    """``MODEL@ALIAS`` / ``MODEL/VERSION`` -> (model, reference); None when ``ref`` names no model version."""
    if "@" in ref:
        model, _, alias = ref.partition("@")
        return (model, alias) if model and alias else None
    if "/" in ref:
        model, _, version = ref.rpartition("/")
        return (model, version) if model and _NUMBER.fullmatch(version) else None
    return None


def resolve_ref(c: Any, ref: str) -> Any:
    """Resolve ``MODEL@ALIAS`` or ``MODEL/VERSION``; errors read '<ref>: not found: <what exists>'."""
    parts = split_ref(ref)
    if parts is None:
        raise RegistryError(f"{ref}: not a model version reference (MODEL@ALIAS or MODEL/VERSION)")
    try:
        return resolve_version(c, *parts)
    except RegistryError as e:
        raise RegistryError(f"{ref}: not found: {e}") from None


# ---- list ------------------------------------------------------------------------------------

@dataclass
class VersionSummary:
    version: str
    aliases: list[str]
    created: str
    base_model: str | None
    datasets: list[dict[str, str]]
    evals: dict[str, dict[str, float]]
    gate_passed: bool | None
    run_id: str | None


def _iso(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds") if ms else "-"


def _datasets_of(model: str, version: str) -> list[dict[str, str]]:
    """Datasets on the version's run and its ancestors (the lifecycle run holds the training data)."""
    # lazy: pydantic_settings (130 ms), via infra.tracking, would load in fast unit tests (test_training_charts.py)
    from infra.tracking.tree import lineage_tree

    node = lineage_tree(f"{model}/{version}").run
    seen: dict[tuple[str, str], dict[str, str]] = {}
    while node is not None:
        for d in node.datasets:
            seen.setdefault((d.name, d.digest), {"name": d.name, "digest": d.digest})
        node = node.parent
    return sorted(seen.values(), key=lambda d: (d["name"], d["digest"]))


def list_versions(model: str) -> list[VersionSummary]:
    """Every version of ``model``, oldest first, with aliases (as of now) and what it was made from."""
    c = client()
    rm = registered_model(c, model)
    by_version: dict[str, list[str]] = {}
    for alias, v in aliases_of(rm).items():
        by_version.setdefault(v, []).append(alias)
    out = []
    for mv in all_versions(c, model):
        v = version_of(mv)
        out.append(summarize(mv, sorted(by_version.get(v, [])), _datasets_of(model, v) if mv.run_id else []))
    return out


def summarize(mv: Any, aliases: list[str], datasets: list[dict[str, str]]) -> VersionSummary:
    """One version as ``temper models list`` shows it, typed (MLflow tags are strings): the gate's
    verdict a bool (None when the version has none), eval counts ints."""
    passed = {"true": True, "false": False}.get(str(mv.tags.get(TAG_GATE_PASSED, "")).lower())
    return VersionSummary(version=version_of(mv), aliases=aliases, created=_iso(mv.creation_timestamp),
                          base_model=mv.tags.get(TAG_BASE_MODEL), datasets=datasets,
                          evals=parse_eval_tags(mv.tags), gate_passed=passed, run_id=mv.run_id)


def num(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def format_versions(model: str, versions: list[VersionSummary]) -> str:
    lines = [f"{model}: {len(versions)} version(s)"]
    for v in versions:
        aliases = " ".join(f"@{a}" for a in v.aliases)
        lines.append(f"v{v.version} {aliases}".rstrip() + f"  created {v.created}  base={v.base_model or '-'}"
                     f"  gate_passed={'-' if v.gate_passed is None else str(v.gate_passed).lower()}")
        for d in v.datasets:
            lines.append(f"    dataset {d['name']} digest={d['digest']}")
        for domain, m in v.evals.items():
            lines.append(f"    eval {domain}: pass_rate={num(m.get('pass_rate'))} "
                         f"mean_reward={num(m.get('mean_reward'))} n={num(m.get('n'), '.0f')}")
    return "\n".join(lines)
