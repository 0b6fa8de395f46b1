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

from temper.core.tag_names import TAG_DOMAIN, TAG_EVAL_LABEL, TAG_KIND, TAG_RECORD, TAG_STAGE


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
    record = lifecycle.data.tags[TAG_RECORD]
    stages = {r.data.tags.get(TAG_STAGE): r for r in _runs(client, f"tags.`{TAG_KIND}` = 'stage'")
              if r.data.tags.get(TAG_RECORD, "").startswith((f"sft-{record}", f"grpo-{record}"))}
    evals = [r for r in _runs(client, f"tags.`{TAG_STAGE}` = 'eval'")
             if r.data.tags.get(TAG_RECORD, "").startswith(lifecycle.info.run_id)]
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
        walls = [r.data.metrics.get("wall_s", 0.0) for r in evals if r.data.tags.get(TAG_EVAL_LABEL) == label]
        if walls:
            lines.append(f"| eval {label} ({len(walls)} domains) | {sum(walls) / 60:.1f} min | "
                         f"{statistics.median(walls):.1f} s per domain (median), {max(walls):.1f} s the longest; "
                         "base and candidate run at once, one core each |")
            facts[f"eval_{label}_s"] = sum(walls)
    return lines, facts


def _grpo_curves(client, lifecycle) -> str:
    record = lifecycle.data.tags[TAG_RECORD]
    run = next((r for r in _runs(client, f"tags.`{TAG_STAGE}` = 'grpo'")
                if r.data.tags.get(TAG_RECORD, "").startswith(f"grpo-{record}")), None)
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


def _samples(client, lifecycle) -> dict[str, dict]:
    """label -> domain -> per-item rewards, as the eval runs of the lifecycle run logged them."""
    from temper.registry.samples import eval_samples

    out: dict[str, dict] = {"base": {}, "candidate": {}}
    for r in _runs(client, f"tags.`{TAG_STAGE}` = 'eval'"):
        if r.data.tags.get(TAG_RECORD, "").startswith(lifecycle.info.run_id):
            domain, label = r.data.tags[TAG_DOMAIN], r.data.tags[TAG_EVAL_LABEL]
            out[label][domain] = eval_samples(r.info.run_id, domain) or []
    return out


def _compare(base: dict, cand: dict, trained: list[str]) -> dict:
    """Per-domain verdicts and the trained / held-out means, by this checkout's ``temper.registry.base_deltas``."""
    from temper.registry.base_deltas import domain_deltas, mean_delta, verdict_counts

    deltas = domain_deltas(base, cand)
    held = sorted(set(cand) - set(trained))
    return {"domains": deltas, "trained": (mean_delta(base, cand, trained), verdict_counts(deltas, trained)),
            "held_out": (mean_delta(base, cand, held), verdict_counts(deltas, held))}


def _without_format_credit(samples: dict[str, list]) -> dict[str, list]:
    """Rewards of at most FORMAT_CREDIT counted as 0: what is left when writing a tagged answer earns nothing."""
    return {d: [(i, None if v is None else (v if v > FORMAT_CREDIT else 0.0)) for i, v in items]
            for d, items in samples.items()}


def _shuffled_answers(home: Path, domains: list[str]) -> dict[str, float]:
    """Per domain: the mean reward reasoning-gym's own scorer gives each eval item when answered with the oracle
    answer of *another* item (the next one). A scorer that reads the task gives that about 0; a high mean is a
    scorer that a well-formed but unrelated answer satisfies."""
    import reasoning_gym

    out = {}
    for domain in domains:
        rows = [json.loads(line) for line in (home / "store/datasets/packs/rg" / f"{domain}.jsonl").open()]
        rows = [r for r in rows if r["split"] == "eval"][:32]
        score = reasoning_gym.get_score_answer_fn(rows[0]["task"])
        other = [rows[(i + 1) % len(rows)]["answer"] for i in range(len(rows))]
        out[domain] = sum(float(score(a, json.loads(r["entry"]))) for a, r in zip(other, rows)) / len(rows)
    return out


def _constant_answers(client, lifecycle, home: Path) -> dict[str, tuple[str, float]]:
    """Per domain: the candidate's most common answer among its logged example completions, and the mean reward that
    one answer, given to every eval item, gets from reasoning-gym's own scorer. A high mean is a scorer a constant
    answer satisfies: what the policy learnt there is the constant, not the task."""
    from collections import Counter

    import reasoning_gym

    from temper.verifiers.families.reasoning_gym import extract

    out = {}
    for r in _runs(client, f"tags.`{TAG_STAGE}` = 'eval' and tags.`{TAG_EVAL_LABEL}` = 'candidate'"):
        if not r.data.tags.get(TAG_RECORD, "").startswith(lifecycle.info.run_id):
            continue
        domain = r.data.tags[TAG_DOMAIN]
        examples = json.loads(Path(client.download_artifacts(r.info.run_id, f"eval/{domain}-examples.json",
                                                             str(home / "report"))).read_text())["samples"]
        answers = Counter(a for a in (extract(e["completion"]) for e in examples) if a)
        if not answers:
            continue
        answer = answers.most_common(1)[0][0]
        rows = [json.loads(line) for line in (home / "store/datasets/packs/rg" / f"{domain}.jsonl").open()]
        rows = [r_ for r_ in rows if r_["split"] == "eval"][:32]
        score = reasoning_gym.get_score_answer_fn(rows[0]["task"])
        out[domain] = (answer, sum(float(score(answer, json.loads(r_["entry"]))) for r_ in rows) / len(rows))
    return out


def _row(which: dict, name: str) -> str:
    m, n = which[name]
    if not m:
        return f"| {name.replace('_', '-')} | 0 | - | - | - | - | - | - | - |"
    return (f"| {name.replace('_', '-')} | {m.domains} | {m.base:.3f} | {m.candidate:.3f} | **{m.delta:+.3f}** | "
            f"[{m.lo:+.3f}, {m.hi:+.3f}] | {n['better']} | {n['unchanged']} | {n['worse']} |")


def _rate(rows: list[dict], key: str) -> float:
    vals = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return sum(vals) / len(vals) if vals else float("nan")


GAMED = 0.5  # a constant answer's mean reward at or above which a domain's scorer counts as gamed

HEAD = ["| domains | n | base | candidate | delta | 95% interval | better | unchanged | worse |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|"]


def report(home: Path, out: Path) -> None:
    client = _client(home)
    lifecycle = _runs(client, f"tags.`{TAG_KIND}` = 'lifecycle' and attributes.status = 'FINISHED'")[0]
    run_id = lifecycle.info.run_id
    versus = json.loads(Path(client.download_artifacts(run_id, "versus_base.json", str(home / "report"))).read_text())
    table = list(csv.DictReader(io.StringIO(
        Path(client.download_artifacts(run_id, "per_domain.csv", str(home / "report"))).read_text())))
    run = json.loads((home / "run.json").read_text()) if (home / "run.json").exists() else {}
    costs, _ = _stage_costs(client, lifecycle)
    # the verdicts again from the per-item rewards the eval runs logged, by this checkout's statistics (the flow's
    # own versus_base.json was written by the commit that ran it: the text says where the two differ)
    samples = _samples(client, lifecycle)
    result = _compare(samples["base"], samples["candidate"], versus["trained"])
    task = _compare(_without_format_credit(samples["base"]), _without_format_credit(samples["candidate"]),
                    versus["trained"])
    differ = sorted(d for d, x in result["domains"].items() if versus["domains"].get(d, {}).get("verdict") != x.verdict)
    (trained, counts), (task_trained, task_counts) = result["trained"], task["trained"]
    constant = _constant_answers(client, lifecycle, home)
    shuffled = _shuffled_answers(home, sorted(samples["candidate"]))
    gamed = sorted({d for d, (_, mean) in constant.items() if mean >= GAMED} |
                   {d for d, mean in shuffled.items() if mean >= GAMED})
    honest = _compare({d: v for d, v in samples["base"].items() if d not in gamed},
                      {d: v for d, v in samples["candidate"].items() if d not in gamed},
                      [d for d in versus["trained"] if d not in gamed])
    goals = [
        ("mean reward over the trained domains up, interval excluding 0", bool(trained and trained.lo > 0)),
        (f"at least a quarter of trained domains significantly better ({counts['better']} of {trained.domains})",
         counts["better"] * 4 >= trained.domains),
        (f"no trained domain significantly worse ({counts['worse']})", counts["worse"] == 0),
        (f"(not a goal of the issue) the same without the {FORMAT_CREDIT} format credit: "
         f"{task_trained.delta:+.3f} [{task_trained.lo:+.3f}, {task_trained.hi:+.3f}], "
         f"{task_counts['better']} of {task_trained.domains} domains better", bool(task_trained.lo > 0)),
    ]
    tr = [r for r in table if r.get("trained") == "True"]
    ho = [r for r in table if r.get("trained") == "False"]
    lines = [
        "# SmolLM2-135M-Instruct through post_training over many reasoning-gym domains",
        "",
        f"Run {run.get('date', '?')}, commit `{run.get('commit', '?')}`, {run.get('cores', '?')} cores, no GPU; "
        f"1-min load average before {run.get('load_before', [0])[0]:.2f}, after {run.get('load_after', [0])[0]:.2f} "
        "(the last stretch of the base eval shared the machine with `make test`). "
        f"Lifecycle run `{run_id}`. Parameters: `configs/params/smollm2-multidomain.yaml` (domains chosen by the rule "
        "in `benchmarks/real_model_multidomain.py`); repeat with `make realistic` and "
        "`.venv/bin/temper demo --params configs/params/smollm2-multidomain.yaml`.",
        "",
        "## Result: candidate (SFT then GRPO) against its base, greedy, 32 held-out items per domain",
        "",
        *HEAD, _row(result, "trained"), _row(result, "held_out"),
        "",
        "better / worse: the domain's paired delta is significant in a two-sided test, Holm-corrected over the domains "
        "(alpha 0.05; a delta without spread is judged by the sign test). Per-domain intervals are 95% paired bootstrap "
        "intervals, not adjusted for multiplicity; the mean's interval resamples each domain's items (domains weigh "
        "equally). Recomputed here from the per-item rewards the eval runs logged"
        + (f"; the flow's own record (`versus_base.json`, written by the run's commit) gives another verdict for "
           f"{len(differ)} domain(s): {', '.join(differ)}." if differ else
           "; the flow's own record (`versus_base.json`) gives the same verdicts."),
        "",
        "Goals of the issue:",
        "",
        *[f"- {'met' if ok else '**not met**'}: {text}" for text, ok in goals],
        "",
        "## Scorers that pay answers unrelated to the item",
        "",
        "Two probes of reasoning-gym's own scorers, per domain, over its 32 eval items: the candidate's most common "
        "answer (among its logged examples) given to every item, and every item answered with the next item's oracle "
        f"answer. {len(gamed)} domain(s) give one of them a mean reward of at least {GAMED}: there a constant or an "
        "unrelated well-formed answer is paid, and what the policy learnt is that, not the task (reward hacking of "
        "the pack's scorers, which temper applies exactly as reasoning-gym does):",
        "",
        "| domain | constant answer | its mean reward | another item's answer: mean reward | candidate |",
        "|---|---|---:|---:|---:|",
        *[f"| {d} | `{constant.get(d, ('-', 0.0))[0][:40]}` | {constant.get(d, ('-', 0.0))[1]:.3f} | "
          f"{shuffled.get(d, 0.0):.3f} | {result['domains'][d].candidate:.3f} |"
          for d in gamed if d in result["domains"]],
        "",
        "Where the answer is one of two or three words (True/False, Yes/No, a name), about 0.5 is the chance a guess "
        "has, not a fault of the scorer. The scorer faults are propositional_logic (the constant `(Q ∨ Q)` earns 0.8), "
        "puzzle24 (another item's expression earns 1.0: the scorer does not check which numbers were used) and, found "
        "by hand, time_intervals (any well-formed duration earns about 1: `0 days, 00:00` scores 0.99999 against "
        "`0 days, 00:01:00`), which this probe misses because its items ask for different formats. Without every "
        "flagged domain (a conservative bound: it also drops the chance-level ones):",
        "",
        *HEAD, _row(honest, "trained"), _row(honest, "held_out"),
        "",
        "## Answer format or the task?",
        "",
        "Share of items scored 0 for their form before their content was judged (no `<answer>` tag, an empty or "
        "oversized answer), mean over domains:",
        "",
        "| domains | base | candidate |",
        "|---|---:|---:|",
        f"| trained | {_rate(tr, 'base_format_zero'):.1%} | {_rate(tr, 'candidate_format_zero'):.1%} |",
        f"| held-out | {_rate(ho, 'base_format_zero'):.1%} | {_rate(ho, 'candidate_format_zero'):.1%} |",
        "",
        f"The pack's scorers give {FORMAT_CREDIT} to most answers that are present but wrong. The same comparison with "
        f"rewards of at most {FORMAT_CREDIT} counted as 0, i.e. what is left when writing a tagged answer earns "
        "nothing:",
        "",
        *HEAD, _row(task, "trained"), _row(task, "held_out"),
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
        x, y = result["domains"].get(r["domain"]), task["domains"].get(r["domain"])
        interval = f"[{x.lo:+.3f}, {x.hi:+.3f}]" if x else "-"
        lines.append(f"| {r['domain']} | {'trained' if r.get('trained') == 'True' else 'held-out'} | "
                     f"{float(r['base']):.3f} | {float(r['candidate']):.3f} | {float(r['delta']):+.3f} | {interval} | "
                     f"{x.verdict if x else '-'} | {y.verdict if y else '-'} | "
                     f"{float(r.get('base_format_zero') or 0):.0%} | {float(r.get('candidate_format_zero') or 0):.0%} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
