"""retrain (scheduled): run post_training only when a dataset changed since the champion.

Digests decide, not timestamps: a regenerated but identical dataset triggers nothing.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task

from flows.post_training import post_training
from tasks.data import resolve_domains
from temper.lifecycle import RetrainParams


@task(retries=3, retry_delay_seconds=[2, 5, 15])
def trained_digests(model_name: str, alias: str) -> dict[str, str] | None:
    from infra import lineage
    from temper.retraining import champion_digests

    lineage.configure()
    return champion_digests(model_name, alias)


@flow(name="retrain", log_prints=True)
def retrain(params: RetrainParams = RetrainParams()) -> dict:
    from temper.retraining import changed_domains

    logger = get_run_logger()
    pt = params.post_training
    current = {r.name: r.digest for r in resolve_domains(pt.domains)}
    changed = changed_domains(trained_digests(pt.model_name, pt.promotion.alias), current)
    if not changed and not params.force:
        logger.info("no dataset changed since %s@%s: nothing to do", pt.model_name, pt.promotion.alias)
        return {"ran": False, "changed": []}
    logger.info("retraining %s: %s", pt.model_name, ", ".join(changed) if changed else "forced")
    result = post_training(pt)
    return {"ran": True, "changed": changed, "registered": result["registered"]}
