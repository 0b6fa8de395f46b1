"""validate_data: catalog -> one contract check per domain (cached by digest) -> report.

Same data and same contract give a cached result: re-running after fixing one domain
re-checks only that domain.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, unmapped
from prefect.artifacts import create_markdown_artifact

from tasks.data import resolve_domains, validate_domain
from tasks.tracking import record_validation
from temper.lifecycle.params import ValidateParams
from temper.lifecycle.report import validation_markdown
from temper.lifecycle.validation import validation_workers


@flow(name="validate_data", log_prints=True)
def validate_data(params: ValidateParams = ValidateParams()) -> dict:
    logger = get_run_logger()
    refs = resolve_domains(params.domains)
    reports = validate_domain.map(refs, unmapped(validation_workers(len(refs)))).result()
    markdown = validation_markdown(reports)
    create_markdown_artifact(markdown=markdown, key="validation-report", description="Data contract results")
    run_id = record_validation(reports, experiment="validate_data", run_name="validate_data")
    failed = [r.domain for r in reports if not r.success]
    logger.info("%d/%d domains pass; MLflow run %s", len(reports) - len(failed), len(reports), run_id)
    return {"success": not failed, "failed": failed, "mlflow_run_id": run_id}
