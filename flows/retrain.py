"""retrain: run post_training only when a dataset changed since the latest version was trained.

    resolve domains (digests) -> latest version of the model (any alias) and its training
    digests -> nothing changed: done | something changed: post_training (gate vs the champion)

Digests decide, not timestamps: a regenerated but identical dataset triggers nothing. Runs
nightly (cron) and on every `temper.dataset.changed` event (prefect.yaml); the deployment's
concurrency limit of 1 queues the runs, so a burst of events trains once.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task

from flows.post_training import post_training
from infra.tracking.connection import configure
from tasks.data import resolve_domains
from temper.lifecycle.params import RetrainParams
from temper.lifecycle.retraining import changed_domains
from temper.lifecycle.retraining import latest_trained as read_latest_trained


@task(retries=3, retry_delay_seconds=[2, 5, 15])
def latest_trained(model_name: str) -> tuple[str | None, dict[str, str] | None]:
    configure()
    return read_latest_trained(model_name)


@flow(name="retrain", log_prints=True)
def retrain(params: RetrainParams = RetrainParams()) -> dict:
    logger = get_run_logger()
    pt = params.post_training
    # the data it would train on: not its held-out or eval-only domains (a changed benchmark is no reason to train)
    held = {r.name for r in resolve_domains(pt.held_out)} if pt.held_out else set()
    current = {r.name: r.digest for r in resolve_domains(pt.domains) if r.role != "eval" and r.name not in held}
    version, trained = latest_trained(pt.model_name)
    changed = changed_domains(trained, current)
    if not changed and not params.force:
        logger.info("no dataset changed since %s version %s: nothing to do", pt.model_name, version)
        return {"ran": False, "changed": [], "latest_version": version}
    logger.info("retraining %s (latest version %s): %s", pt.model_name, version,
                ", ".join(changed) if changed else "forced")
    result = post_training(pt)
    return {"ran": True, "changed": changed, "latest_version": version, "registered": result["registered"]}
