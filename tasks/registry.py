"""Prefect tasks around the model registry: champion lookup, gate, registration, lineage records."""

from __future__ import annotations

from prefect import task

from data_contracts.runner import DomainReport
from temper.gate import GateDecision, PromotionPolicy
from temper.lifecycle import PostTrainingParams

_MLFLOW_RETRY = dict(retries=3, retry_delay_seconds=[2, 5, 15])


@task(**_MLFLOW_RETRY)
def open_lifecycle(params: PostTrainingParams, run_name: str, reports: list[DomainReport]) -> str:
    """The lifecycle parent run: config, tags, and every dataset consumed (with digests)."""
    import mlflow

    from infra import lineage
    from temper.catalog import load_catalog
    from temper.settings import get_settings
    from temper.validation import log_validated_datasets

    settings = get_settings()
    lineage.configure(settings)
    run_id = lineage.open_run("post_training", run_name, tags={
        lineage.TAG_KIND: "lifecycle", lineage.TAG_CONFIG_HASH: lineage.config_hash(params),
        lineage.TAG_BASE_MODEL: params.base_model})
    catalog = load_catalog(settings.catalog_dir)
    with lineage.resume_run(run_id):
        mlflow.log_dict(params.model_dump(mode="json"), "params.json")
        log_validated_datasets(reports, [catalog[r.domain] for r in reports], "training", settings)
        mlflow.set_tag("temper.validation", "pass" if all(r.success for r in reports) else "fail")
    return run_id


@task(**_MLFLOW_RETRY)
def close_lifecycle(run_id: str, status: str, report_markdown: str) -> None:
    import mlflow

    from infra import lineage

    with lineage.resume_run(run_id):
        mlflow.log_text(report_markdown, "report.md")
    lineage.close_run(run_id, status)


@task(**_MLFLOW_RETRY)
def champion(model_name: str, alias: str) -> tuple[str | None, dict[str, float] | None]:
    from infra import lineage
    from temper.registry import champion_metrics

    lineage.configure()
    return champion_metrics(model_name, alias)


@task
def gate(candidate: dict[str, float], champion_means: dict[str, float] | None, policy: PromotionPolicy) -> GateDecision:
    from temper.gate import decide

    return decide(candidate, champion_means, policy)


@task(**_MLFLOW_RETRY)
def register(params: PostTrainingParams, model_dir: str, parent_run_id: str, eval_results: dict[str, dict],
             decision: GateDecision) -> dict:
    """A 'register' stage run holding the model files, then the version with metrics and alias."""
    import mlflow

    from infra import lineage
    from temper.registry import register_version

    lineage.configure()
    run_id = lineage.open_run("post_training", "register", parent_run_id=parent_run_id,
                              tags={lineage.TAG_KIND: "stage", lineage.TAG_STAGE: "register",
                                    lineage.TAG_BASE_MODEL: params.base_model,
                                    lineage.TAG_CONFIG_HASH: lineage.config_hash(params)})
    with mlflow.start_run(run_id=run_id) as run:
        mlflow.log_artifacts(model_dir, "model")
        for d, r in eval_results.items():
            mlflow.log_metrics({f"eval.{d}.mean_reward": r["mean_reward"], f"eval.{d}.pass_rate": r["pass_rate"]})
        source = f"{run.info.artifact_uri.rstrip('/')}/model"
    return register_version(params.model_name, source, run_id, eval_results=eval_results, decision=decision,
                            alias=params.promotion.alias, fallback_alias=params.promotion.fallback_alias,
                            tags={lineage.TAG_BASE_MODEL: params.base_model, lineage.TAG_GIT: lineage.code_version(),
                                  "temper.lifecycle_run": parent_run_id})
