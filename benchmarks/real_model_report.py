"""The results file of ``real_model_multidomain.py``: one post_training run read back from its MLflow store.

Everything comes from what the flow recorded (nothing is recomputed from the model): the lifecycle run's
``versus_base.json`` and ``per_domain.csv`` (the paired intervals and Holm verdicts the flow computed), the
stage runs' metric histories (GRPO step time, tokens, KL, reward), the eval runs' wall time, and the
``run.json`` the ``run`` step wrote (wall time, peak memory, load, commit).
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path


def _client(home: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{(home / 'mlflow.db').resolve()}")
    return mlflow.MlflowClient()


def _runs(client, kind_filter: str) -> list:
    exp = client.get_experiment_by_name("post_training")
    return client.search_runs([exp.experiment_id], filter_string=kind_filter, order_by=["attribute.start_time DESC"],
                              max_results=5000)


def _history(client, run_id: str, key: str) -> list[float]:
    """One value per step (the trainer's end-of-training summary logs its last step a second time)."""
    by_step: dict[int, float] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
        by_step.setdefault(m.step, m.value)
    return [by_step[k] for k in sorted(by_step)]


def _minutes(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 60000:.1f} min"


def _stage_costs(client, lifecycle) -> tuple[list[str], dict]:
    """Wall time per stage (from the runs' start and end), GRPO step time and tokens/s, eval time per domain."""
    record = lifecycle.data.tags["temper.record"]
    stages = {r.data.tags.get("temper.stage"): r for r in _runs(client, "tags.`temper.kind` = 'stage'")
              if r.data.tags.get("temper.record", "").startswith((f"sft-{record}", f"grpo-{record}"))}
    evals = [r for r in _runs(client, "tags.`temper.stage` = 'eval'")
             if r.data.tags.get("temper.record", "").startswith(lifecycle.info.run_id)]
    lines, facts = [], {}
    for name in ("sft", "grpo"):
        run = stages.get(name)
        if run is None:
            continue
        steps = _history(client, run.info.run_id, "step_time_s")
        tokens = _history(client, run.info.run_id, "num_tokens")
        per_step = [b - a for a, b in zip([0.0, *tokens], tokens)] if name == "grpo" else []
        rate = _history(client, run.info.run_id, "tokens_per_s")
        wall = (run.info.end_time or run.info.start_time) - run.info.start_time
        facts[name] = {"wall_ms": wall, "steps": len(steps),
                       "median_step_s": statistics.median(steps) if steps else None}
        detail = f"{len(steps)} steps, median step {statistics.median(steps):.1f} s" if steps else ""
        if per_step and steps:
            tps = [t / s for t, s in zip(per_step, steps) if s > 0]
            detail += f", {statistics.median(tps):.0f} tokens/s (prompt + completion, median step)"
        elif rate:
            detail += f", {statistics.median(rate):.0f} tokens/s (median step)"
        lines.append(f"| {name.upper()} | {_minutes(wall)} | {detail} |")
    for label in ("base", "candidate"):
        walls = [r.data.metrics.get("wall_s", 0.0) for r in evals if r.data.tags.get("temper.eval.label") == label]
        if walls:
            lines.append(f"| eval {label} ({len(walls)} domains) | {sum(walls) / 60:.1f} min | "
                         f"{statistics.median(walls):.1f} s per domain (median), {max(walls):.1f} s the longest; "
                         "base and candidate run at once, one core each |")
            facts[f"eval_{label}_s"] = sum(walls)
    return lines, facts


def _grpo_curves(client, lifecycle) -> str:
    record = lifecycle.data.tags["temper.record"]
    run = next((r for r in _runs(client, "tags.`temper.stage` = 'grpo'")
                if r.data.tags.get("temper.record", "").startswith(f"grpo-{record}")), None)
    if run is None:
        return "no GRPO run found"
    reward, kl = _history(client, run.info.run_id, "reward"), _history(client, run.info.run_id, "kl")
    flat = _history(client, run.info.run_id, "frac_reward_zero_std")
    q = max(1, len(reward) // 4)
    parts = [f"reward (mean of the step's completions): first quarter {statistics.mean(reward[:q]):.3f}, "
             f"last quarter {statistics.mean(reward[-q:]):.3f}"] if reward else []
    if kl:
        parts.append(f"KL to the SFT model: max {max(kl):.4f}, last {kl[-1]:.4f}")
    if flat:
        parts.append(f"groups without signal (all G completions alike): {statistics.mean(flat):.0%} of groups")
    return "; ".join(parts) + f" (MLflow run `{run.info.run_id}`: reward, kl and weight_<domain> curves)."


#: reasoning-gym's scorers give 0.01 to an answer that is present but wrong (most tasks): credit for the format
FORMAT_CREDIT = 0.01


def _beyond_format(client, lifecycle, trained: list[str]) -> dict:
    """The same paired test with the format credit taken away (rewards <= 0.01 count as 0): which domains improved
    on the task itself, not by writing a tagged answer."""
    from temper.registry.base_deltas import domain_deltas, mean_delta, verdict_counts
    from temper.registry.samples import eval_samples

    samples: dict[str, dict] = {"base": {}, "candidate": {}}
    for r in _runs(client, "tags.`temper.stage` = 'eval'"):
        if r.data.tags.get("temper.record", "").startswith(lifecycle.info.run_id):
            domain, label = r.data.tags["temper.domain"], r.data.tags["temper.eval.label"]
            samples[label][domain] = [(i, None if v is None else (v if v > FORMAT_CREDIT else 0.0))
                                      for i, v in eval_samples(r.info.run_id, domain) or []]
    base, cand = samples["base"], samples["candidate"]
    deltas = domain_deltas(base, cand)
    held = sorted(set(cand) - set(trained))
    return {"trained": (mean_delta(base, cand, trained), verdict_counts(deltas, trained)),
            "held_out": (mean_delta(base, cand, held), verdict_counts(deltas, held)), "domains": deltas}


def report(home: Path, out: Path) -> None:
    client = _client(home)
    lifecycle = _runs(client, "tags.`temper.kind` = 'lifecycle' and attributes.status = 'FINISHED'")[0]
    run_id = lifecycle.info.run_id
    versus = json.loads(Path(client.download_artifacts(run_id, "versus_base.json", str(home / "report"))).read_text())
    table = list(csv.DictReader(io.StringIO(
        Path(client.download_artifacts(run_id, "per_domain.csv", str(home / "report"))).read_text())))
    run = json.loads((home / "run.json").read_text()) if (home / "run.json").exists() else {}
    costs, facts = _stage_costs(client, lifecycle)

    def group(name: str) -> str:
        m, n = versus["means"].get(name), versus["counts"][name]
        if not m:
            return f"| {name} | - |"
        return (f"| {name.replace('_', '-')} | {m['domains']} | {m['base']:.3f} | {m['candidate']:.3f} | "
                f"**{m['delta']:+.3f}** | [{m['lo']:+.3f}, {m['hi']:+.3f}] | {n['better']} | {n['unchanged']} | "
                f"{n['worse']} |")

    trained = versus["means"]["trained"]
    counts = versus["counts"]["trained"]
    goals = [
        ("mean reward over the trained domains up, interval excluding 0", trained and trained["lo"] > 0),
        (f"at least a quarter of trained domains significantly better ({counts['better']} of {trained['domains']})",
         trained and counts["better"] * 4 >= trained["domains"]),
        (f"no trained domain significantly worse ({counts['worse']})", counts["worse"] == 0),
    ]

    def rate(rows: list[dict], key: str) -> float:
        vals = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
        return sum(vals) / len(vals) if vals else float("nan")

    task = _beyond_format(client, lifecycle, versus["trained"])

    def task_row(name: str) -> str:
        m, n = task[name]
        if not m:
            return f"| {name} | - |"
        return (f"| {name.replace('_', '-')} | {m.base:.3f} | {m.candidate:.3f} | {m.delta:+.3f} | "
                f"[{m.lo:+.3f}, {m.hi:+.3f}] | {n['better']} | {n['unchanged']} | {n['worse']} |")

    tr = [r for r in table if r.get("trained") == "True"]
    ho = [r for r in table if r.get("trained") == "False"]
    lines = [
        "# SmolLM2-135M-Instruct through post_training over many reasoning-gym domains",
        "",
        f"Run {run.get('date', '?')}, commit `{run.get('commit', '?')}`, {run.get('cores', '?')} cores, no GPU; "
        f"load average before {run.get('load_before', ['?'])[0]}, after {run.get('load_after', ['?'])[0]}. "
        f"Lifecycle run `{run_id}`. Parameters: `configs/params/smollm2-multidomain.yaml` (domains chosen by the rule "
        "in `benchmarks/real_model_multidomain.py`); repeat with `make realistic` and "
        "`.venv/bin/temper demo --params configs/params/smollm2-multidomain.yaml`.",
        "",
        "## Result: candidate (SFT then GRPO) against its base, greedy, 32 held-out items per domain",
        "",
        "| domains | n | base | candidate | delta | 95% interval | better | unchanged | worse |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
        group("trained"), group("held_out"),
        "",
        "better / worse: the domain's paired bootstrap delta is significant after Holm over the domains (alpha 0.05, "
        "one test per direction). The mean's interval resamples each domain's items (domains weigh equally).",
        "",
        "Goals of the issue:",
        "",
        *[f"- {'met' if ok else '**not met**'}: {text}" for text, ok in goals],
        "",
        "## Answer format or the task?",
        "",
        "Share of items scored 0 for their form before their content was judged (no `<answer>` tag, an empty or "
        "oversized answer), mean over domains:",
        "",
        "| domains | base | candidate |",
        "|---|---:|---:|",
        f"| trained | {rate(tr, 'base_format_zero'):.1%} | {rate(tr, 'candidate_format_zero'):.1%} |",
        f"| held-out | {rate(ho, 'base_format_zero'):.1%} | {rate(ho, 'candidate_format_zero'):.1%} |",
        "",
        f"The pack's scorers give {FORMAT_CREDIT} to most answers that are present but wrong. The same test with "
        f"rewards of at most {FORMAT_CREDIT} counted as 0, i.e. what is left when writing a tagged answer earns "
        "nothing:",
        "",
        "| domains | base | candidate | delta | 95% interval | better | unchanged | worse |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
        task_row("trained"), task_row("held_out"),
        "",
        "## Costs",
        "",
        f"Whole flow (`temper demo`: datasets kept from `select`, contracts, SFT, GRPO, both evals, gate, "
        f"registration): **{run.get('wall_s', 0) / 60:.1f} min**; peak memory of the process tree "
        f"{run.get('peak_rss_gib', 0):.1f} GiB.",
        "",
        "| stage | wall | detail |",
        "|---|---|---|",
        *costs,
        "",
        "GRPO curves: " + _grpo_curves(client, lifecycle),
        "",
        "## Per domain",
        "",
        "| domain | set | base | candidate | delta | 95% interval | verdict | beyond format | no-answer base | "
        "no-answer candidate |",
        "|---|---|---:|---:|---:|---|---|---|---:|---:|",
    ]
    for r in sorted(table, key=lambda r: (r.get("trained") != "True", -float(r["delta"] or 0), r["domain"])):
        lo, hi = r.get("lo"), r.get("hi")
        interval = f"[{float(lo):+.3f}, {float(hi):+.3f}]" if lo not in (None, "") else "-"
        lines.append(f"| {r['domain']} | {'trained' if r.get('trained') == 'True' else 'held-out'} | "
                     f"{float(r['base']):.3f} | {float(r['candidate']):.3f} | {float(r['delta']):+.3f} | {interval} | "
                     f"{r.get('verdict', '-')} | {getattr(task['domains'].get(r['domain']), 'verdict', '-')} | "
                     f"{float(r.get('base_format_zero') or 0):.0%} | "
                     f"{float(r.get('candidate_format_zero') or 0):.0%} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
