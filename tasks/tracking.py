"""Prefect tasks that write to MLflow. Retried: a tracking server restart must not fail a run."""

from __future__ import annotations

from prefect import task

from data_contracts.report import DomainReport
from infra.tracking.connection import configure
from infra.tracking.runs import lifecycle_run, stage_run, use_experiment
from temper.core.errors import TrackingUnreachable
from temper.core.settings import get_settings
from temper.data.catalog import load_catalog
from temper.lifecycle.validation import ValidationSummary, track_validation


def not_an_outage(task, task_run, state) -> bool:
    """Retry a tracking task unless it failed because the server stayed away for the whole retry budget
    (``tracking_retry_s``: every MLflow call already retried that long; the flow fails with that one line)."""
    try:
        state.result()
    except TrackingUnreachable:
        return False
    except Exception:
        return True
    return True


# A tracking server restart must not fail a run; one that outlasts the budget ends it at once.
MLFLOW_RETRY = dict(retries=3, retry_delay_seconds=[2, 5, 15], retry_condition_fn=not_an_outage)


@task(**MLFLOW_RETRY)
def record_validation(reports: list[DomainReport], experiment: str, run_name: str, parent_run_id: str | None = None) -> str:
    """Log the validation stage (datasets with digests, report) as an MLflow run; returns its id."""

    settings = get_settings()
    configure(settings)
    catalog = load_catalog(settings.catalog_dir)
    domains = [catalog[r.domain] for r in reports]
    summary = ValidationSummary(reports=reports, docs_uri=None)
    if parent_run_id:
        use_experiment(experiment)
        with stage_run("validate", parent_run_id=parent_run_id) as run:
            track_validation(summary, domains, settings)
            return run.info.run_id
    with lifecycle_run(experiment, run_name, config={"domains": [d.name for d in domains]}) as run:
        track_validation(summary, domains, settings)
        return run.info.run_id
