"""``temper models compare``: per-domain deltas of two versions with a bootstrap interval each,
so a +0.02 on 64 samples is not mistaken for progress; recorded as a table and chart in MLflow."""

from __future__ import annotations

import fnmatch
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infra.tracking.runs import close_run, open_run
from temper.core.tag_names import TAG_COMPARE_A, TAG_COMPARE_B, TAG_COMPARE_MODEL, TAG_KIND, TAG_STAGE
from temper.registry.bootstrap import CONFIDENCE, DeltaInterval, bootstrap_delta
from temper.registry.effective_context import FRACTION, effective_context, lost_context
from temper.registry.samples import version_curves, version_samples
from temper.registry.store import RegistryOpError, client, version_of
from temper.registry.tags import parse_eval_tags
from temper.registry.versions import num, resolve_version

COMPARE_EXPERIMENT = "registry_ops"


def significance_hint(interval: DeltaInterval | None, a: str, b: str) -> str:
    if interval is None:
        return "n/a (no per-sample rewards)"
    ci = f"{interval.level:.0%} CI [{interval.lo:+.3f}, {interval.hi:+.3f}]"
    if interval.lo > 0:
        return f"v{b} better ({ci})"
    if interval.hi < 0:
        return f"v{a} better ({ci})"
    return f"no significant difference ({ci})"


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
    context: dict[str, dict[str, str]] = field(default_factory=dict)  # long-context domain -> a, b, verdict

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_metrics(model: str, a: str, b: str, metrics_a: dict[str, dict[str, float]],
                    metrics_b: dict[str, dict[str, float]], samples_a: dict[str, list], samples_b: dict[str, list],
                    domains: str | None = None, *, seed: int = 0, curves_a: dict[str, list] | None = None,
                    curves_b: dict[str, list] | None = None) -> Comparison:
    """The pure part of ``compare``: rows of common domains (filtered by the glob), deltas B - A; and for
    long-context domains with (tokens, reward) curves on both sides, each one's effective context length."""
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
    context = {}
    for d in selected:
        if d in (curves_a or {}) and d in (curves_b or {}):
            ea, eb = effective_context(curves_a[d], seed=seed), effective_context(curves_b[d], seed=seed)
            verdict = f"v{b} lost context" if lost_context(eb, ea) else f"v{a} lost context" if lost_context(ea, eb) \
                else "no significant difference" if ea.measurable and eb.measurable else "not comparable"
            context[d] = {"a": ea.describe(), "b": eb.describe(), "verdict": verdict}
    return Comparison(model=model, a=a, b=b, rows=rows, only_a=sorted(set(metrics_a) - set(metrics_b)),
                      only_b=sorted(set(metrics_b) - set(metrics_a)), context=context)


def compare(model: str, a: str, b: str, domains: str | None = None, *, log: bool = True, seed: int = 0) -> Comparison:
    """Compare two versions (numbers or aliases) per domain; with ``log``, record table + chart in MLflow."""
    c = client()
    mva, mvb = resolve_version(c, model, a), resolve_version(c, model, b)
    cmp = compare_metrics(model, version_of(mva), version_of(mvb), parse_eval_tags(mva.tags),
                          parse_eval_tags(mvb.tags), version_samples(mva), version_samples(mvb), domains, seed=seed,
                          curves_a=version_curves(mva), curves_b=version_curves(mvb))
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
            cells.append(f"{num(r.a.get(k))} -> {num(r.b.get(k))} ({num(r.delta.get(k), '+.3f')})")
        cells.append(f"{num(r.a.get('n'), '.0f')}/{num(r.b.get('n'), '.0f')}")
        cells.append(r.hint)
        table.append(tuple(cells))
    widths = [max(len(row[i]) for row in table) for i in range(len(cols) - 1)]
    lines = [head] + ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in table]
    if cmp.context:
        lines.append(f"effective context length (longest prompt at >= {FRACTION:.0%} of short-context accuracy):")
        lines += [f"  {d}: v{cmp.a} {c['a']} -> v{cmp.b} {c['b']}: {c['verdict']}" for d, c in sorted(cmp.context.items())]
    for label, only in ((cmp.a, cmp.only_a), (cmp.b, cmp.only_b)):
        if only:
            lines.append(f"only in v{label} (not compared): {', '.join(only)}")
    if cmp.run_id:
        lines.append(f"chart: MLflow run {cmp.run_id}, artifact compare/chart.png")
    return "\n".join(lines)


def comparison_chart(cmp: Comparison, path: str) -> None:
    """Pass rate and mean reward per domain (A vs B), and the mean-reward delta with its bootstrap CI."""
    # lazy: matplotlib (600 ms) would load in fast unit tests (test_registry_ops_units.py)
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib (600 ms) would load in fast unit tests (test_registry_ops_units.py)
    import matplotlib.pyplot as plt

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
    run_id = open_run(COMPARE_EXPERIMENT, f"compare-{cmp.model}-v{cmp.a}-v{cmp.b}", tags={
        TAG_KIND: "ops", TAG_STAGE: "compare", TAG_COMPARE_MODEL: cmp.model,
        TAG_COMPARE_A: cmp.a, TAG_COMPARE_B: cmp.b})
    c = client()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            png = Path(tmp) / "chart.png"
            comparison_chart(cmp, str(png))
            c.log_artifact(run_id, str(png), "compare")
        c.log_dict(run_id, cmp.to_dict(), "compare/comparison.json")
    except Exception:
        close_run(run_id, "FAILED")
        raise
    close_run(run_id)
    return run_id
