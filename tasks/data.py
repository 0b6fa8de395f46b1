"""Prefect tasks for the data stage: resolve the catalog, validate each domain (cached by digest)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefect import task
from prefect.context import TaskRunContext

from data_contracts.model import Contract, load_contracts
from data_contracts.report import DomainReport
from infra.tracking.connection import configure
from infra.tracking.runs import config_hash
from temper.core.errors import DatasetError
from temper.core.settings import get_settings
from temper.data.catalog import load_catalog, select_domains
from temper.data.domain import Domain
from temper.data.packs import contract_for


@dataclass(frozen=True)
class DomainRef:
    """A domain as the flow passes it between tasks: its name, the digest of its data now, and the
    domain and contract as resolved once (a mapped task must not reload the catalog: at hundreds
    of domains that made the fan-out quadratic)."""

    name: str
    digest: str | None  # None: dataset missing (validation reports it)
    contract_hash: str
    domain: Domain = field(compare=False, repr=False)
    contract: Contract | None = field(compare=False, repr=False)
    role: str = "both"  # the domain's catalog role: eval-only domains are validated and evaluated, never trained


def _validation_cache_key(_ctx: TaskRunContext, params: dict) -> str:
    ref: DomainRef = params["ref"]
    return f"validate-{ref.name}-{ref.digest}-{ref.contract_hash}" if ref.digest else None  # never cache missing data


@task(retries=2, retry_delay_seconds=[2, 10])
def resolve_domains(patterns: list[str] | None, catalog_dir: str | None = None) -> list[DomainRef]:
    """Catalog -> selected domains with their current dataset digests (retried: the store may blip)."""
    # lazy: fsspec (60 ms), via datasets, would load whenever flows.evaluate is imported
    from temper.data.datasets import dataset_digest

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
        refs.append(DomainRef(d.name, digest, config_hash(c) if c else "missing", d, c, d.role))
    return refs


@task(cache_key_fn=_validation_cache_key, persist_result=True, task_run_name="validate-{ref.name}")
def validate_domain(ref: DomainRef, workers: int = 1) -> DomainReport:
    """One domain through its GX contract. Same data + same contract = cached result, no rerun.

    ``workers``: processes shared by all of the flow's validation tasks (``validation_workers``).
    """
    # lazy: fsspec (60 ms), via validation, would load whenever flows.evaluate is imported
    from temper.lifecycle.validation import shared_validator

    return shared_validator(workers).validate(ref.domain, ref.contract, get_settings())


def gated_mixing_weights(domains: list, kept: dict[str, float], requested: dict[str, float]) -> dict[str, float]:
    """The mixing weights training gets after the gate: the requested ones of kept domains, plus
    every weight the gate changed (a down-weighted domain). A domain the gate left alone keeps its
    catalog ``sampling_ratio`` implicitly, so an ungated run trains with exactly what was asked."""
    ratios = {d.name: d.sampling_ratio for d in domains}
    return {name: w for name, w in kept.items() if name in requested or w != ratios[name]}


@task(retries=2, retry_delay_seconds=[2, 10])
def calibration_gate(refs: list[DomainRef], mixing_weights: dict[str, float] | None = None,
                     catalog_dir: str | None = None) -> tuple[list[DomainRef], dict[str, float], dict[str, str]]:
    """Judge-scored domains whose judge is not calibrated against humans are excluded or down-weighted.

    Returns (domains kept, the mixing weights to train them with, domain -> why it was flagged).
    The weights start from ``mixing_weights`` (the run's) or the catalog's sampling ratios; a
    down-weighted domain's weight is ``factor`` x that, and the flow passes them to GRPO.
    No MLflow call at all when no selected domain is judge-scored.
    """
    # lazy: sklearn+scipy (1.5 s), via calibration, would load whenever flows.evaluate is imported
    from temper.judges.calibration import (
        CalibrationPolicy,
        apply_calibration_gate,
        calibration_status,
    )

    requested = dict(mixing_weights or {})
    catalog = load_catalog(catalog_dir or get_settings().catalog_dir)
    domains = [catalog[r.name] for r in refs]
    judged = [d.name for d in domains if d.verifier.family == "judge"]
    statuses = {}
    if judged:
        configure()
        statuses = calibration_status(judged)
    kept, flagged = apply_calibration_gate(domains, statuses, CalibrationPolicy(), base_weights=requested)
    weights = gated_mixing_weights(domains, kept, requested)
    for d in domains:
        base = requested.get(d.name, d.sampling_ratio)
        if d.name in kept and kept[d.name] != base:
            flagged[d.name] = (f"down-weighted: sampling weight {base:g} -> {kept[d.name]:g} "
                               "(judge not verified against human labels)")
    return [r for r in refs if r.name in kept], weights, flagged
