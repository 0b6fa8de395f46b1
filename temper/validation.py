"""Validate domain datasets against their data contracts (the gate before any compute).

A problem with one domain (missing dataset, unknown contract) is reported for that domain
and the others are still checked, so one run tells the whole story. Store outages raise:
nothing can be checked then.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from data_contracts.model import Contract, load_contracts
from data_contracts.runner import DomainReport, GXRunner
from infra.storage import join, put_dir
from temper.catalog import Domain
from temper.datasets import load_dataset
from temper.errors import DatasetError
from temper.packs import contract_for
from temper.settings import Settings, get_settings


@dataclass
class ValidationSummary:
    reports: list[DomainReport]
    docs_uri: str | None
    docs_local: Path | None = None

    @property
    def success(self) -> bool:
        return all(r.success for r in self.reports)

    def to_dict(self) -> dict:
        return {"success": self.success, "docs_uri": self.docs_uri, "domains": [r.to_dict() for r in self.reports]}


def validate_domain(domain: Domain, contract: Contract | None, runner: GXRunner, settings: Settings) -> DomainReport:
    uri = domain.dataset_uri(settings.resolved_storage_root)
    if contract is None:
        return DomainReport(domain=domain.name, contract=domain.contract, dataset_uri=uri, digest="", rows=0,
                            success=False, expectations=0,
                            error=f"contract {domain.contract!r} not found in the contracts directory")
    try:
        ds = load_dataset(domain, settings)
    except DatasetError as e:
        return DomainReport(domain=domain.name, contract=contract.name, dataset_uri=uri, digest="", rows=0,
                            success=False, expectations=0, error=str(e))
    return runner.validate(domain.name, contract, ds.frame, dataset_uri=ds.uri, digest=ds.digest)


def validate_domains(domains: list[Domain], settings: Settings | None = None, *, build_docs: bool = True,
                     contracts: dict[str, Contract] | None = None) -> ValidationSummary:
    settings = settings or get_settings()
    contracts = contracts if contracts is not None else load_contracts(settings.resolved_contracts_dir)
    docs_local = Path(tempfile.mkdtemp(prefix="temper-docs-"))
    runner = GXRunner(docs_dir=docs_local)
    reports = [validate_domain(d, contract_for(d, contracts), runner, settings) for d in domains]
    docs_uri = None
    if build_docs and any(r.expectations for r in reports):
        runner.build_docs()
        docs_uri = join(settings.resolved_storage_root, "validation", "data_docs")
        put_dir(str(docs_local), docs_uri, settings)
    return ValidationSummary(reports=reports, docs_uri=docs_uri, docs_local=docs_local if docs_uri else None)


def format_report(summary: ValidationSummary) -> str:
    lines = []
    for r in summary.reports:
        status = "PASS" if r.success else "FAIL"
        lines.append(f"{status} {r.domain} (contract {r.contract}, {r.rows} rows, digest {r.digest[:12] or '-'})")
        if r.error:
            lines.append(f"    error: {r.error}")
        for f in r.failures:
            pct = "" if f.unexpected_percent is None else f" ({f.unexpected_percent}%)"
            count = "" if f.unexpected_count is None else f" unexpected={f.unexpected_count}{pct}"
            observed = "" if f.observed is None else f" observed={f.observed!r}"
            lines.append(f"    {f.expectation} [{f.check}] column={f.column}{count}{observed} "
                         f"samples={f.sample_values}")
    n_ok = sum(r.success for r in summary.reports)
    lines.append(f"{n_ok}/{len(summary.reports)} domains pass" + (f"; data docs: {summary.docs_uri}" if summary.docs_uri else ""))
    return "\n".join(lines)


def log_validated_datasets(reports: list[DomainReport], domains: list[Domain], context: str,
                           settings: Settings | None = None) -> None:
    """Log each validated dataset on the active MLflow run (name, digest, source).

    The data is read again for MLflow's dataset profile; if its digest is no longer the
    validated one, the file changed after validation and lineage would lie, so it is an error.
    """
    from infra.lineage import log_dataset

    settings = settings or get_settings()
    by_name = {d.name: d for d in domains}
    for r in reports:
        if not r.digest:
            continue
        ds = load_dataset(by_name[r.domain], settings)
        if ds.digest != r.digest:
            raise DatasetError(f"dataset {ds.uri} changed after validation (sha256 {r.digest[:12]} -> "
                               f"{ds.digest[:12]}); validate again")
        log_dataset(r.domain, ds.frame, ds.uri, ds.digest, context=context)


def track_validation(summary: ValidationSummary, domains: list[Domain], settings: Settings | None = None) -> None:
    """Log a validation to the active MLflow run: datasets as inputs, report and Data Docs as artifacts."""
    import mlflow

    log_validated_datasets(summary.reports, domains, "validation", settings)
    for r in summary.reports:
        mlflow.log_metric(f"contract_failures.{r.domain}", len(r.failures) + (1 if r.error else 0))
    mlflow.log_dict(summary.to_dict(), "validation/report.json")
    mlflow.set_tag("temper.validation", "pass" if summary.success else "fail")
    if summary.docs_local:
        mlflow.log_artifacts(str(summary.docs_local), "validation/data_docs")
