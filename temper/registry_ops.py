"""Registry operations a person (or a Prefect deployment) runs by hand: list, compare, promote, roll back.

The lifecycle flow registers versions and sets aliases by its gate; these are the levers
around it. Why each exists:

- ``list_versions``: what is in the registry, and what each version was trained on / scored.
- ``compare``: per-domain deltas with a bootstrap interval, so a +0.02 on 64 samples is not
  mistaken for progress.
- ``promote``: move an alias on purpose, through the same gate as the flow unless forced,
  with a reason that stays on record.
- ``rollback``: the fast path back when a promoted model misbehaves. No gate: the previous
  holder was already trusted, and speed matters more than a second opinion.

Audit trail: every promote/rollback appends one event to the registered model's tags,
``temper.audit.<alias>.<seq>`` = JSON (action, version, previous holder, time, reason, who,
gate). Registered-model tags because aliases are model-level; the version that receives the
alias also gets ``temper.audit.<alias>`` = the same event, so its page in the MLflow UI says
why it holds the alias. Rollback replays the trail as a stack of holders, so successive
rollbacks walk further back (v3 -> v2 -> v1) instead of toggling between the last two.
"""

from __future__ import annotations

import fnmatch
import getpass
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from temper.core.errors import TrackingError
from temper.gate import GateDecision, PromotionPolicy, decide
from temper.registry import RegistryError, eval_samples, lifecycle_run_id, stage_runs

AUDIT_TAG = "temper.audit.{alias}.{seq:06d}"
VERSION_AUDIT_TAG = "temper.audit.{alias}"
MAX_REASON_CHARS = 1000  # the event must fit in one registry tag value
COMPARE_EXPERIMENT = "registry_ops"
CONFIDENCE = 0.95


class RegistryOpError(RegistryError):
    """Kept distinct so callers can tell 'the operation was refused' from 'the thing does not exist'."""


class GateBlocked(RegistryOpError):
    """The promotion gate said no, and --force was not given; no alias changed."""


# ---- typed parameters (the Prefect UI renders these) -----------------------------------------

class PromoteParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(description="Registered model name.")
    version: str = Field(description="Version number (or an alias, e.g. 'candidate') to promote.")
    alias: str = Field(default="champion", description="Alias to move onto the version.")
    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS, description="Why; kept in the audit trail.")
    force: bool = Field(default=False, description="Promote even if the gate says no (recorded as forced).")
    policy: PromotionPolicy = Field(default_factory=PromotionPolicy,
                                    description="Gate thresholds (its alias fields are ignored here).")


class RollbackParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(description="Registered model name.")
    alias: str = Field(default="champion", description="Alias to move back to its previous holder.")
    reason: str = Field(default="rollback", min_length=1, max_length=MAX_REASON_CHARS,
                        description="Why; kept in the audit trail.")


# ---- pure logic ------------------------------------------------------------------------------

def parse_eval_tags(tags: dict[str, str]) -> dict[str, dict[str, float]]:
    """``temper.eval.<domain>.<metric>`` tags -> domain -> metric -> value (domain may contain dots)."""
    out: dict[str, dict[str, float]] = {}
    for key, value in tags.items():
        if not key.startswith("temper.eval."):
            continue
        domain, _, metric = key.removeprefix("temper.eval.").rpartition(".")
        if not domain:
            continue
        try:
            out.setdefault(domain, {})[metric] = float(value)
        except ValueError:
            continue
    return dict(sorted(out.items()))


def mean_rewards(tags: dict[str, str]) -> dict[str, float]:
    """The gate's input: domain -> mean reward."""
    return {d: m["mean_reward"] for d, m in parse_eval_tags(tags).items() if "mean_reward" in m}


@dataclass(frozen=True)
class AuditEvent:
    seq: int
    action: Literal["promote", "rollback"]
    alias: str
    version: str
    previous: str | None
    time: str
    reason: str
    by: str
    forced: bool = False
    gate: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def audit_events(model_tags: dict[str, str], alias: str) -> list[AuditEvent]:
    """The audit trail of one alias, in order. Unreadable entries are skipped, not fatal:
    a hand-edited tag must not lock the operator out of a rollback."""
    prefix = f"temper.audit.{alias}."
    events = []
    for key, value in model_tags.items():
        if not key.startswith(prefix) or not key.removeprefix(prefix).isdigit():
            continue
        try:
            obj = json.loads(value)
            events.append(AuditEvent(**{**obj, "seq": int(key.removeprefix(prefix))}))
        except (ValueError, TypeError):
            continue
    return sorted(events, key=lambda e: e.seq)


def holder_stack(events: list[AuditEvent]) -> list[str]:
    """Replay the trail into the stack of holders (last = most recent).

    promote pushes (seeding with its 'previous' holder when the trail starts there, so the
    first rollback can return to a holder the flow set without an event); rollback pops back
    to the version it moved to.
    """
    stack: list[str] = []
    for e in events:
        if e.action == "promote":
            if not stack and e.previous is not None:
                stack.append(e.previous)
            if not stack or stack[-1] != e.version:
                stack.append(e.version)
        else:
            while stack and stack[-1] != e.version:
                stack.pop()
            if not stack:
                stack.append(e.version)
    return stack


def rollback_target(events: list[AuditEvent], current: str | None) -> str | None:
    """Where a rollback goes: the most recent earlier holder that is not the current one."""
    stack = holder_stack(events)
    while stack and stack[-1] == current:
        stack.pop()
    return stack[-1] if stack else None


@dataclass(frozen=True)
class DeltaInterval:
    """Bootstrap interval of mean reward (B - A) on one domain."""

    delta: float
    lo: float
    hi: float
    level: float
    paired: bool
    n_a: int
    n_b: int


def bootstrap_delta(a: list[tuple[str, float | None]], b: list[tuple[str, float | None]], *,
                    n_boot: int = 2000, level: float = CONFIDENCE, seed: int = 0) -> DeltaInterval | None:
    """Percentile bootstrap of mean(B) - mean(A) over per-sample rewards; None if either side is empty.

    Paired (resample sample ids, difference per id) when both were scored on the same ids,
    which is the normal case (same eval split) and much tighter; independent resampling otherwise.
    Unscored samples (reward None) are left out, as in the mean reward itself.
    """
    import numpy as np

    ra = {i: r for i, r in a if r is not None}
    rb = {i: r for i, r in b if r is not None}
    if not ra or not rb:
        return None
    rng = np.random.default_rng(seed)
    paired = ra.keys() == rb.keys()
    if paired:
        ids = sorted(ra)
        diff = np.array([rb[i] - ra[i] for i in ids])
        boots = diff[rng.integers(0, len(diff), (n_boot, len(diff)))].mean(axis=1)
        point = float(diff.mean())
    else:
        va, vb = np.array(list(ra.values())), np.array(list(rb.values()))
        boots = (vb[rng.integers(0, len(vb), (n_boot, len(vb)))].mean(axis=1)
                 - va[rng.integers(0, len(va), (n_boot, len(va)))].mean(axis=1))
        point = float(vb.mean() - va.mean())
    lo, hi = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return DeltaInterval(delta=point, lo=float(lo), hi=float(hi), level=level, paired=paired,
                         n_a=len(ra), n_b=len(rb))


def significance_hint(interval: DeltaInterval | None, a: str, b: str) -> str:
    if interval is None:
        return "n/a (no per-sample rewards)"
    ci = f"{interval.level:.0%} CI [{interval.lo:+.3f}, {interval.hi:+.3f}]"
    if interval.lo > 0:
        return f"v{b} better ({ci})"
    if interval.hi < 0:
        return f"v{a} better ({ci})"
    return f"no significant difference ({ci})"


# ---- registry access -------------------------------------------------------------------------

def _client():
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def _mlflow_message(e: Exception) -> str:
    return (getattr(e, "message", None) or str(e)).splitlines()[0]


def registered_model(client: Any, model: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(model)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            raise RegistryError(f"unknown registered model {model!r} at {client.tracking_uri}") from None
        raise TrackingError(f"cannot read registered model {model!r}: {_mlflow_message(e)}") from None


def _versions(client: Any, model: str) -> list[Any]:
    found = client.search_model_versions(f"name = '{model}'")
    return sorted(found, key=lambda mv: int(mv.version))


def resolve_version(client: Any, model: str, ref: str) -> Any:
    """``ref`` = a version number ('3' or 'v3') or an alias; the error lists what does exist."""
    from mlflow.exceptions import MlflowException

    rm = registered_model(client, model)
    number = re.fullmatch(r"v?(\d+)", ref)
    if number:
        try:
            return client.get_model_version(model, number.group(1))
        except MlflowException:
            known = ", ".join(mv.version for mv in _versions(client, model)) or "none"
            raise RegistryError(f"{model}: no version {number.group(1)} (versions: {known})") from None
    aliases = dict(rm.aliases or {})
    if ref not in aliases:
        known = ", ".join(f"{a}->v{v}" for a, v in sorted(aliases.items())) or "none"
        raise RegistryError(f"{model}: no alias {ref!r} (aliases: {known})")
    return client.get_model_version(model, aliases[ref])


# ---- list ------------------------------------------------------------------------------------

@dataclass
class VersionSummary:
    version: str
    aliases: list[str]
    created: str
    base_model: str | None
    datasets: list[dict[str, str]]
    evals: dict[str, dict[str, float]]
    gate_passed: str | None
    run_id: str | None


def _iso(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds") if ms else "-"


def _datasets_of(model: str, version: str) -> list[dict[str, str]]:
    """Datasets on the version's run and its ancestors (the lifecycle run holds the training data)."""
    from infra import lineage

    node = lineage.lineage_tree(f"{model}/{version}").run
    seen: dict[tuple[str, str], dict[str, str]] = {}
    while node is not None:
        for d in node.datasets:
            seen.setdefault((d.name, d.digest), {"name": d.name, "digest": d.digest})
        node = node.parent
    return sorted(seen.values(), key=lambda d: (d["name"], d["digest"]))


def list_versions(model: str) -> list[VersionSummary]:
    """Every version of ``model``, oldest first, with aliases (as of now) and what it was made from."""
    client = _client()
    rm = registered_model(client, model)
    by_version: dict[str, list[str]] = {}
    for alias, v in (rm.aliases or {}).items():
        by_version.setdefault(str(v), []).append(alias)
    out = []
    for mv in _versions(client, model):
        out.append(VersionSummary(
            version=mv.version, aliases=sorted(by_version.get(mv.version, [])), created=_iso(mv.creation_timestamp),
            base_model=mv.tags.get("temper.base_model"),
            datasets=_datasets_of(model, mv.version) if mv.run_id else [],
            evals=parse_eval_tags(mv.tags), gate_passed=mv.tags.get("temper.gate.passed"), run_id=mv.run_id))
    return out


def format_versions(model: str, versions: list[VersionSummary]) -> str:
    lines = [f"{model}: {len(versions)} version(s)"]
    for v in versions:
        aliases = " ".join(f"@{a}" for a in v.aliases)
        lines.append(f"v{v.version} {aliases}".rstrip() + f"  created {v.created}  base={v.base_model or '-'}"
                     f"  gate_passed={v.gate_passed or '-'}")
        for d in v.datasets:
            lines.append(f"    dataset {d['name']} digest={d['digest']}")
        for domain, m in v.evals.items():
            lines.append(f"    eval {domain}: pass_rate={_num(m.get('pass_rate'))} "
                         f"mean_reward={_num(m.get('mean_reward'))} n={_num(m.get('n'), '.0f')}")
    return "\n".join(lines)


def _num(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


# ---- compare ---------------------------------------------------------------------------------

@dataclass
class DomainComparison:
    domain: str
    a: dict[str, float]
    b: dict[str, float]
    delta: dict[str, float]
    interval: DeltaInterval | None
    hint: str


@dataclass
class Comparison:
    model: str
    a: str
    b: str
    rows: list[DomainComparison]
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    run_id: str | None = None  # the MLflow run holding the chart

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def version_samples(mv: Any) -> dict[str, list[tuple[str, float | None]]]:
    """domain -> per-sample rewards, from the eval runs of the version's lifecycle run.

    Eval runs are children of the lifecycle run with temper.stage=eval; each may hold one or
    more ``eval/<domain>.jsonl``. A version without a lifecycle run has no samples.
    """
    lifecycle = lifecycle_run_id(mv)
    if not lifecycle:
        return {}
    out: dict[str, list[tuple[str, float | None]]] = {}
    for run in stage_runs(lifecycle):
        if run.data.tags.get("temper.stage") != "eval":
            continue
        domains = [run.data.tags["temper.domain"]] if run.data.tags.get("temper.domain") else \
            [a.path.removeprefix("eval/").removesuffix(".jsonl")
             for a in _client().list_artifacts(run.info.run_id, "eval") if a.path.endswith(".jsonl")]
        for d in domains:
            samples = eval_samples(run.info.run_id, d)
            if samples is not None:
                out[d] = samples
    return out


def compare_metrics(model: str, a: str, b: str, metrics_a: dict[str, dict[str, float]],
                    metrics_b: dict[str, dict[str, float]], samples_a: dict[str, list], samples_b: dict[str, list],
                    domains: str | None = None, *, seed: int = 0) -> Comparison:
    """The pure part of ``compare``: rows of common domains (filtered by the glob), deltas B - A."""
    common = sorted(set(metrics_a) & set(metrics_b))
    if not common:
        raise RegistryOpError(f"{model}: v{a} and v{b} share no evaluated domain "
                              f"(v{a}: {', '.join(sorted(metrics_a)) or 'none'}; "
                              f"v{b}: {', '.join(sorted(metrics_b)) or 'none'})")
    selected = [d for d in common if domains is None or fnmatch.fnmatchcase(d, domains)]
    if not selected:
        raise RegistryOpError(f"{model}: no common domain of v{a} and v{b} matches {domains!r} "
                              f"(common: {', '.join(common)})")
    rows = []
    for d in selected:
        ma, mb = metrics_a[d], metrics_b[d]
        delta = {k: mb[k] - ma[k] for k in ("pass_rate", "mean_reward", "n") if k in ma and k in mb}
        interval = None
        if d in samples_a and d in samples_b:
            interval = bootstrap_delta(samples_a[d], samples_b[d], seed=seed)
        rows.append(DomainComparison(domain=d, a=ma, b=mb, delta=delta, interval=interval,
                                     hint=significance_hint(interval, a, b)))
    return Comparison(model=model, a=a, b=b, rows=rows, only_a=sorted(set(metrics_a) - set(metrics_b)),
                      only_b=sorted(set(metrics_b) - set(metrics_a)))


def compare(model: str, a: str, b: str, domains: str | None = None, *, log: bool = True, seed: int = 0) -> Comparison:
    """Compare two versions (numbers or aliases) per domain; with ``log``, record table + chart in MLflow."""
    client = _client()
    mva, mvb = resolve_version(client, model, a), resolve_version(client, model, b)
    cmp = compare_metrics(model, mva.version, mvb.version, parse_eval_tags(mva.tags), parse_eval_tags(mvb.tags),
                          version_samples(mva), version_samples(mvb), domains, seed=seed)
    if log:
        cmp.run_id = log_comparison(cmp)
    return cmp


def format_comparison(cmp: Comparison) -> str:
    head = (f"{cmp.model}: v{cmp.a} -> v{cmp.b} (delta = v{cmp.b} - v{cmp.a}; "
            f"significance from a bootstrap of per-sample mean reward)")
    cols = ("domain", "pass_rate", "mean_reward", "n", "significance")
    table = [cols]
    for r in cmp.rows:
        cells = [r.domain]
        for k in ("pass_rate", "mean_reward"):
            cells.append(f"{_num(r.a.get(k))} -> {_num(r.b.get(k))} ({_num(r.delta.get(k), '+.3f')})")
        cells.append(f"{_num(r.a.get('n'), '.0f')}/{_num(r.b.get('n'), '.0f')}")
        cells.append(r.hint)
        table.append(tuple(cells))
    widths = [max(len(row[i]) for row in table) for i in range(len(cols) - 1)]
    lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in table]
    for label, only in ((cmp.a, cmp.only_a), (cmp.b, cmp.only_b)):
        if only:
            lines.append(f"only in v{label} (not compared): {', '.join(only)}")
    if cmp.run_id:
        lines.append(f"chart: MLflow run {cmp.run_id}, artifact compare/chart.png")
    return "\n".join(lines)


def comparison_chart(cmp: Comparison, path: str) -> None:
    """Pass rate and mean reward per domain (A vs B), and the mean-reward delta with its bootstrap CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    domains = [r.domain for r in cmp.rows]
    x = np.arange(len(domains))
    fig, axes = plt.subplots(1, 3, figsize=(max(8.0, 2.0 * len(domains) + 5), 3.6))
    for ax, metric in zip(axes, ("pass_rate", "mean_reward")):
        ax.bar(x - 0.2, [r.a.get(metric, np.nan) for r in cmp.rows], 0.4, label=f"v{cmp.a}")
        ax.bar(x + 0.2, [r.b.get(metric, np.nan) for r in cmp.rows], 0.4, label=f"v{cmp.b}")
        ax.set_ylim(0, 1.05)
        ax.set_title(metric)
    axes[0].legend()
    deltas = np.array([r.delta.get("mean_reward", np.nan) for r in cmp.rows])
    err = np.array([[d - r.interval.lo, r.interval.hi - d] if r.interval else [np.nan, np.nan]
                    for d, r in zip(deltas, cmp.rows)]).T  # NaN: no whisker where there are no samples
    axes[2].bar(x, deltas, 0.5, color=["tab:green" if d >= 0 else "tab:red" for d in deltas],
                yerr=np.clip(err, 0, None), capsize=4)
    axes[2].axhline(0, color="black", linewidth=0.8)
    axes[2].set_title(f"mean_reward v{cmp.b} - v{cmp.a} ({CONFIDENCE:.0%} CI)")
    for ax in axes:
        ax.set_xticks(x, domains, rotation=20, ha="right")
    fig.suptitle(f"{cmp.model}: v{cmp.a} vs v{cmp.b}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def log_comparison(cmp: Comparison) -> str:
    """One run in the ``registry_ops`` experiment with the table (JSON) and the chart (PNG)."""
    import tempfile
    from pathlib import Path

    from infra import lineage

    run_id = lineage.open_run(COMPARE_EXPERIMENT, f"compare-{cmp.model}-v{cmp.a}-v{cmp.b}", tags={
        lineage.TAG_KIND: "ops", lineage.TAG_STAGE: "compare", "temper.model": cmp.model,
        "temper.compare.a": cmp.a, "temper.compare.b": cmp.b})
    client = _client()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / "chart.png"
            comparison_chart(cmp, str(png))
            client.log_artifact(run_id, str(png), "compare")
        client.log_dict(run_id, cmp.to_dict(), "compare/comparison.json")
    except Exception:
        lineage.close_run(run_id, "FAILED")
        raise
    lineage.close_run(run_id)
    return run_id


# ---- promote / rollback ----------------------------------------------------------------------

@dataclass
class AliasChange:
    model: str
    alias: str
    version: str
    previous: str | None
    changed: bool
    event: AuditEvent | None = None
    gate: GateDecision | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gate"] = self.gate.model_dump() if self.gate else None
        return d

    def summary(self) -> str:
        if not self.changed:
            return f"{self.model}@{self.alias} already on v{self.version}; nothing changed"
        prev = f"v{self.previous}" if self.previous else "nobody"
        line = f"{self.model}@{self.alias}: {prev} -> v{self.version} ({self.event.action} #{self.event.seq})"
        if self.gate is not None:
            line += f"; gate: {'pass' if self.gate.passed else 'FAIL (forced)'}: {self.gate.reason}"
        return line


def _check_reason(reason: str | None) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise RegistryOpError("a reason is required (--reason TEXT); it is kept in the audit trail")
    if len(reason) > MAX_REASON_CHARS:
        raise RegistryOpError(f"reason is {len(reason)} characters; at most {MAX_REASON_CHARS}")
    return reason


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _move_alias(client: Any, model: str, alias: str, version: str, previous: str | None, event: AuditEvent) -> None:
    """Set the alias, then record the event; if recording fails, put the alias back.

    Order matters: an event for a move that never happened would send a later rollback to
    a version that never held the alias.
    """
    from mlflow.exceptions import MlflowException

    try:
        client.set_registered_model_alias(model, alias, version)
    except MlflowException as e:
        raise RegistryOpError(f"{model}: cannot set alias {alias!r} on v{version}: {_mlflow_message(e)}") from None
    try:
        client.set_registered_model_tag(model, AUDIT_TAG.format(alias=alias, seq=event.seq), event.to_json())
        client.set_model_version_tag(model, version, VERSION_AUDIT_TAG.format(alias=alias), event.to_json())
    except MlflowException as e:
        if previous is None:
            client.delete_registered_model_alias(model, alias)
        else:
            client.set_registered_model_alias(model, alias, previous)
        raise TrackingError(f"{model}@{alias}: could not record the audit event ({_mlflow_message(e)}); "
                            f"alias restored to {('v' + previous) if previous else 'unset'}") from None


def promote(model: str, version: str, *, reason: str, alias: str = "champion", force: bool = False,
            policy: PromotionPolicy | None = None) -> AliasChange:
    """Move ``alias`` to ``version`` if the gate (candidate vs current holder) passes, or if forced."""
    reason = _check_reason(reason)
    client = _client()
    rm = registered_model(client, model)
    mv = resolve_version(client, model, version)
    current = (rm.aliases or {}).get(alias)
    current = str(current) if current is not None else None
    if current == mv.version:
        return AliasChange(model=model, alias=alias, version=mv.version, previous=current, changed=False)
    holder_means = mean_rewards(client.get_model_version(model, current).tags) if current else None
    decision = decide(mean_rewards(mv.tags), holder_means, policy or PromotionPolicy())
    if not decision.passed and not force:
        on = f"v{current}" if current else "unset"
        raise GateBlocked(f"{model} v{mv.version} -> @{alias} blocked by the gate: {decision.reason} "
                          f"(@{alias} stays {on}; --force to override)")
    seq = max((e.seq for e in audit_events(rm.tags, alias)), default=0) + 1
    event = AuditEvent(seq=seq, action="promote", alias=alias, version=mv.version, previous=current, time=_now(),
                       reason=reason, by=_who(), forced=not decision.passed, gate=decision.reason)
    _move_alias(client, model, alias, mv.version, current, event)
    return AliasChange(model=model, alias=alias, version=mv.version, previous=current, changed=True, event=event,
                       gate=decision)


def record_flow_alias(client: Any, model: str, alias: str, version: str, *, reason: str,
                      gate: str | None = None) -> AuditEvent:
    """Set the alias the post_training flow's gate chose, with the same audit event as ``promote``,
    so a later ``rollback`` can return to the version the flow replaced."""
    rm = registered_model(client, model)
    previous = (rm.aliases or {}).get(alias)
    previous = str(previous) if previous is not None else None
    seq = max((e.seq for e in audit_events(rm.tags, alias)), default=0) + 1
    event = AuditEvent(seq=seq, action="promote", alias=alias, version=str(version), previous=previous, time=_now(),
                       reason=reason, by=f"{_who()} (post_training flow)", gate=gate)
    _move_alias(client, model, alias, str(version), previous, event)
    return event


def rollback(model: str, *, alias: str = "champion", reason: str = "rollback") -> AliasChange:
    """Move ``alias`` back to its previous holder per the audit trail; no gate."""
    from mlflow.exceptions import MlflowException

    reason = _check_reason(reason)
    client = _client()
    rm = registered_model(client, model)
    current = (rm.aliases or {}).get(alias)
    current = str(current) if current is not None else None
    events = audit_events(rm.tags, alias)
    target = rollback_target(events, current)
    if target is None:
        held = f"v{current}" if current else "unset"
        raise RegistryOpError(f"{model}@{alias}: no previous holder in the audit trail ({len(events)} event(s); "
                              f"@{alias} is {held}); nothing to roll back to")
    try:
        client.get_model_version(model, target)
    except MlflowException:
        raise RegistryOpError(f"{model}@{alias}: previous holder v{target} no longer exists; "
                              f"promote a version explicitly") from None
    event = AuditEvent(seq=max(e.seq for e in events) + 1, action="rollback", alias=alias, version=target,
                       previous=current, time=_now(), reason=reason, by=_who())
    _move_alias(client, model, alias, target, current, event)
    return AliasChange(model=model, alias=alias, version=target, previous=current, changed=True, event=event)


def audit_trail(model: str, alias: str = "champion") -> list[AuditEvent]:
    client = _client()
    return audit_events(registered_model(client, model).tags, alias)
