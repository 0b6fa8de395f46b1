"""Prefect tasks for the data stage: resolve the catalog, validate each domain (cached by digest)."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.context import TaskRunContext

from data_contracts.runner import DomainReport


@dataclass(frozen=True)
class DomainRef:
    """A domain as the flow passes it between tasks: its name and the digest of its data now."""

    name: str
    digest: str | None  # None: dataset missing (validation reports it)
    contract_hash: str


def _validation_cache_key(_ctx: TaskRunContext, params: dict) -> str:
    ref: DomainRef = params["ref"]
    return f"validate-{ref.name}-{ref.digest}-{ref.contract_hash}" if ref.digest else None  # never cache missing data


@task(retries=2, retry_delay_seconds=[2, 10])
def resolve_domains(patterns: list[str] | None, catalog_dir: str | None = None) -> list[DomainRef]:
    """Catalog -> selected domains with their current dataset digests (retried: the store may blip)."""
    from infra.lineage import config_hash
    from data_contracts.model import load_contracts
    from temper.catalog import load_catalog, select_domains
    from temper.datasets import dataset_digest
    from temper.errors import DatasetError
    from temper.packs import contract_for
    from temper.settings import get_settings

    settings = get_settings()
    domains = select_domains(load_catalog(catalog_dir or settings.catalog_dir), patterns)
    contracts = load_contracts(settings.resolved_contracts_dir)
    refs = []
    for d in domains:
        try:
            digest = dataset_digest(d, settings)
        except DatasetError:
            digest = None
        c = contract_for(d, contracts)
        refs.append(DomainRef(d.name, digest, config_hash(c) if c else "missing"))
    return refs


@task(cache_key_fn=_validation_cache_key, persist_result=True, task_run_name="validate-{ref.name}")
def validate_domain(ref: DomainRef, catalog_dir: str | None = None) -> DomainReport:
    """One domain through its GX contract. Same data + same contract = cached result, no rerun."""
    from data_contracts.model import load_contracts
    from data_contracts.runner import GXRunner
    from temper.catalog import load_catalog
    from temper.packs import contract_for
    from temper.settings import get_settings
    from temper.validation import validate_domain as run

    settings = get_settings()
    domain = load_catalog(catalog_dir or settings.catalog_dir)[ref.name]
    contract = contract_for(domain, load_contracts(settings.resolved_contracts_dir))
    return run(domain, contract, GXRunner(), settings)


@task(retries=2, retry_delay_seconds=[2, 10])
def calibration_gate(refs: list[DomainRef], catalog_dir: str | None = None) -> tuple[list[DomainRef], dict[str, float], dict[str, str]]:
    """Judge-scored domains whose judge is not calibrated against humans are excluded or down-weighted.

    Returns (domains kept, sampling weights of the kept ones, domain -> reason it was flagged).
    No MLflow call at all when no selected domain is judge-scored.
    """
    from infra import lineage
    from temper.catalog import load_catalog
    from temper.judges.calibration import CalibrationPolicy, apply_calibration_gate, calibration_status
    from temper.settings import get_settings

    catalog = load_catalog(catalog_dir or get_settings().catalog_dir)
    domains = [catalog[r.name] for r in refs]
    judged = [d.name for d in domains if d.verifier.family == "judge"]
    statuses = {}
    if judged:
        lineage.configure()
        statuses = calibration_status(judged)
    weights, flagged = apply_calibration_gate(domains, statuses, CalibrationPolicy())
    return [r for r in refs if r.name in weights], weights, flagged
