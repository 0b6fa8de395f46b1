"""Eval results in MLflow: one 'eval' stage run per (model, domain), child of the lifecycle run.

The eval job (``workloads/evaluate.py``) only computes; recording happens here, in the
orchestrating process, so a Kubernetes eval Job needs no tracking credentials. The run
carries the summary metrics and the per-sample rewards (``temper.registry.samples.log_eval_samples``)
that ``temper models compare`` bootstraps from; a multi-step domain's run also carries its episodes
(turns, wall time and endings as metrics, the trajectories, a few of them as readable pages).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from infra.tracking.connection import configure, outage_named
from infra.tracking.runs import keyed_runs, open_keyed_run
from temper.agent import trajectories
from temper.agent.environment import ENDINGS
from temper.core.tag_names import (
    TAG_CONTEXT_CURVE,
    TAG_DOMAIN,
    TAG_EFFECTIVE_CONTEXT,
    TAG_EVAL_LABEL,
    TAG_EVAL_REUSED_FROM,
    TAG_KIND,
    TAG_SHA256,
    TAG_STAGE,
)
from temper.registry.effective_context import context_figure, effective_context
from temper.registry.samples import log_eval_samples


def eval_key(parent_run_id: str, label: str, domain: str) -> str:
    """The record key of one (model, domain) eval of a lifecycle run: what an earlier attempt is found by."""
    return f"{parent_run_id}/eval-{label}-{domain}"


def recorded_evals(parent_run_id: str, label: str, domains: list[str],
                   experiment: str = "post_training") -> list[dict[str, Any]] | None:
    """The summaries of an earlier attempt's finished eval runs of every domain, or None if one is missing:
    a continued run (`temper resume`) does not evaluate a model again when its results are all recorded."""
    configure(wait=True)
    out = []
    with outage_named(f"the lookup of the {label} evals"):
        for domain in domains:
            run = next((r for r in keyed_runs(experiment, eval_key(parent_run_id, label, domain))
                        if r.info.status == "FINISHED"), None)
            if run is None:
                return None
            m, tags = run.data.metrics, run.data.tags
            out.append({"domain": domain, "mean_reward": m["mean_reward"], "pass_rate": m["pass_rate"],
                        "n": int(run.data.params["n"]), "scored": int(m["scored"]), "run_id": run.info.run_id,
                        "format_zero_rate": m.get("format_zero_rate", 0.0),
                        "long_context": tags.get(TAG_CONTEXT_CURVE) == "true"}
                       | ({"effective_context": tags[TAG_EFFECTIVE_CONTEXT]} if TAG_EFFECTIVE_CONTEXT in tags else {}))
    return out


def record_eval(result: dict[str, Any], label: str, parent_run_id: str, experiment: str = "post_training",
                reused_from: str | None = None) -> str:
    """Log one domain's eval result as a child run of ``parent_run_id``; returns the run id.

    Found by its key: an earlier attempt's FINISHED run of the same eval is returned as it is, a
    half-written one is replaced, so a lifecycle run has one eval run per (model, domain).
    ``reused_from``: the eval run that computed this result (``temper.lifecycle.eval_reuse``), as a tag."""
    configure(wait=True)
    with outage_named(f"the record of the {label} eval of {result['domain']}"):
        run_id, existed = open_keyed_run(
            experiment, eval_key(parent_run_id, label, result["domain"]), f"eval-{label}-{result['domain']}",
            parent_run_id=parent_run_id, fresh=True, tags={
                TAG_KIND: "stage", TAG_STAGE: "eval", TAG_DOMAIN: result["domain"], TAG_EVAL_LABEL: label,
                TAG_SHA256: result["dataset_sha256"]}
            | ({TAG_CONTEXT_CURVE: "true"} if result.get("context_lengths") else {})
            | ({TAG_EVAL_REUSED_FROM: reused_from} if reused_from else {}))
        if not existed:
            _log_eval(run_id, result)
    return run_id


def _log_eval(run_id: str, result: dict[str, Any]) -> None:
    # lazy: mlflow (1.6 s) would load whenever flows.evaluate is imported
    import mlflow

    with mlflow.start_run(run_id=run_id):
        mlflow.log_params({"model": result["model"], "dataset_uri": result["dataset_uri"], "n": result["n"]})
        mlflow.log_metrics({"mean_reward": result["mean_reward"], "pass_rate": result["pass_rate"],
                            "scored": result["scored"], "wall_s": result["wall_s"],
                            "too_long": result.get("too_long", 0), "format_zero_rate": format_zero_rate(result)}
                           | prompt_reuse(result))
        if result.get("zero_reasons"):
            mlflow.log_dict(result["zero_reasons"], f"eval/{result['domain']}-zero-reasons.json")
        tokens = result.get("context_lengths") or None
        episodes = [{"turns": n, "outcome": o} for n, o in zip(result.get("turns", []), result.get("outcomes", []))]
        log_eval_samples(result["domain"], list(zip(result["ids"], result["rewards"])), tokens, episodes or None)
        mlflow.log_dict({"samples": result.get("samples", [])}, f"eval/{result['domain']}-examples.json")
        if result.get("trajectories"):
            record_episodes(result["domain"], result["trajectories"])
        if tokens:
            record_effective_context(result["domain"], list(zip(tokens, result["rewards"])))


SAMPLED_TRAJECTORIES = 4  # eval episodes per multi-step domain shown as readable pages


def record_episodes(domain: str, lines: list[dict[str, Any]]) -> None:
    """On the active eval run of a multi-step domain: turns per episode, episode wall time and the count of
    each ending as metrics, every episode as a trajectory file (``temper replay`` reads it) and the first
    few as readable pages (``trajectories/<domain>/``)."""
    # lazy: mlflow (1.6 s) would load whenever flows.evaluate is imported
    import mlflow

    n = len(lines)
    ends = Counter(t["outcome"] for t in lines)
    mlflow.log_metrics({"turns_per_episode": sum(len(t["turns"]) for t in lines) / n,
                        "episode_wall_s": sum(float(t.get("wall_s") or 0.0) for t in lines) / n}
                       | {f"ended_{e}": float(ends.get(e, 0)) for e in ENDINGS})
    mlflow.log_text("".join(json.dumps(t, default=str) + "\n" for t in lines), f"eval/{domain}-trajectories.jsonl")
    for i, t in enumerate(lines[:SAMPLED_TRAJECTORIES]):
        mlflow.log_text(trajectories.markdown(t), f"trajectories/{domain}/{trajectories.artifact_name(t, i)}")


def format_zero_rate(result: dict[str, Any]) -> float:
    """Share of a domain's eval items scored 0 for their form before their content was judged (the verifier's
    reason: no <answer> tag, an empty or oversized answer): how much of a score is answer format, not the task."""
    return sum((result.get("zero_reasons") or {}).values()) / result["n"] if result.get("n") else 0.0


def prompt_reuse(result: dict[str, Any]) -> dict[str, float]:
    """The eval's prompt tokens served from the rollout server's prefix cache (records sharing a document or
    a long instruction) as metrics; none for the local generator, which reports no prompt tokens."""
    total = result.get("prompt_tokens") or 0
    if not total:
        return {}
    cached = result.get("cached_prompt_tokens") or 0
    return {"prompt_tokens": total, "cached_prompt_tokens": cached, "prompt_hit_rate": cached / total}


def record_effective_context(domain: str, curve: list[tuple[int, float | None]]) -> None:
    """On the active eval run: accuracy per length and the effective context length (table and plot), and
    the length as a metric when it is measurable (a model below the short-context floor has none)."""
    # lazy: mlflow (1.6 s) would load whenever flows.evaluate is imported
    import mlflow

    ec = effective_context(curve)
    mlflow.log_dict(ec.to_dict(), f"eval/{domain}-context.json")
    fig = context_figure(ec, f"{domain}: accuracy vs prompt length")
    mlflow.log_figure(fig, f"eval/{domain}-context.png")
    fig.clf()
    mlflow.log_metrics({"short_context_accuracy": ec.short_accuracy}
                       | ({"effective_context_tokens": ec.effective_tokens} if ec.measurable else {}))
    mlflow.set_tag(TAG_EFFECTIVE_CONTEXT, ec.describe())


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """What travels on: the numbers the gate and the registry tags need (not the samples)."""
    out = {k: result[k] for k in ("domain", "mean_reward", "pass_rate", "n", "scored")} | {
        "run_id": result.get("run_id"), "long_context": bool(result.get("context_lengths")),
        "format_zero_rate": format_zero_rate(result)}
    if out["long_context"]:
        out["effective_context"] = effective_context(list(zip(result["context_lengths"], result["rewards"]))).describe()
    return out
