"""Eval results in MLflow: one 'eval' stage run per (model, domain), child of the lifecycle run.

The eval job (``workloads/evaluate.py``) only computes; recording happens here, in the
orchestrating process, so a Kubernetes eval Job needs no tracking credentials. The run
carries the summary metrics and the per-sample rewards (``temper.registry.samples.log_eval_samples``)
that ``temper models compare`` bootstraps from.
"""

from __future__ import annotations

from typing import Any

from infra import lineage
from temper.registry.effective_context import context_figure, effective_context
from temper.registry.samples import CONTEXT_TAG
from temper.registry.samples import DOMAIN_TAG as TAG_DOMAIN
from temper.registry.samples import (
    LABEL_TAG as TAG_LABEL,  # 'base' or 'candidate': which model was scored
)
from temper.registry.samples import log_eval_samples


def record_eval(result: dict[str, Any], label: str, parent_run_id: str, experiment: str = "post_training") -> str:
    """Log one domain's eval result as a child run of ``parent_run_id``; returns the run id."""
    # lazy: mlflow (1.6 s) would load whenever flows.evaluate is imported
    import mlflow

    lineage.configure()
    tokens = result.get("context_lengths") or None
    run_id = lineage.open_run(experiment, f"eval-{label}-{result['domain']}", parent_run_id=parent_run_id, tags={
        lineage.TAG_KIND: "stage", lineage.TAG_STAGE: "eval", TAG_DOMAIN: result["domain"], TAG_LABEL: label,
        lineage.TAG_SHA256: result["dataset_sha256"]} | ({CONTEXT_TAG: "true"} if tokens else {}))
    with mlflow.start_run(run_id=run_id):
        mlflow.log_params({"model": result["model"], "dataset_uri": result["dataset_uri"], "n": result["n"]})
        mlflow.log_metrics({"mean_reward": result["mean_reward"], "pass_rate": result["pass_rate"],
                            "scored": result["scored"], "wall_s": result["wall_s"],
                            "too_long": result.get("too_long", 0)})
        log_eval_samples(result["domain"], list(zip(result["ids"], result["rewards"])), tokens)
        mlflow.log_dict({"samples": result.get("samples", [])}, f"eval/{result['domain']}-examples.json")
        if tokens:
            record_effective_context(result["domain"], list(zip(tokens, result["rewards"])))
    return run_id


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
    mlflow.set_tag("temper.eval.effective_context", ec.describe())


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """What travels on: the numbers the gate and the registry tags need (not the samples)."""
    out = {k: result[k] for k in ("domain", "mean_reward", "pass_rate", "n", "scored")} | {
        "run_id": result.get("run_id"), "long_context": bool(result.get("context_lengths"))}
    if out["long_context"]:
        out["effective_context"] = effective_context(list(zip(result["context_lengths"], result["rewards"]))).describe()
    return out
