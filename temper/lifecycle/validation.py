"""Validate domain datasets against their data contracts (the gate before any compute).

A problem with one domain (missing dataset, unknown contract) is reported for that domain
and the others are still checked, so one run tells the whole story. Store outages raise:
nothing can be checked then.
"""

from __future__ import annotations

import functools
import html
import multiprocessing
import os
import tempfile
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from data_contracts.model import Contract, load_contracts
from data_contracts.report import DomainReport
from infra.storage import join, put_dir
from infra.tracking.runs import log_datasets
from temper.core.errors import DatasetError
from temper.core.settings import Settings, get_settings
from temper.core.tag_names import CONTEXT_VALIDATION, TAG_DATA_VALIDATION
from temper.core.templates import template_columns
from temper.data.datasets import load_dataset
from temper.data.domain import Domain
from temper.data.packs import contract_for
from temper.verifiers import get_verifier

if TYPE_CHECKING:
    from data_contracts.runner import GXRunner


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
    report = runner.validate(domain.name, contract, ds.frame, dataset_uri=ds.uri, digest=ds.digest)
    problems = domain_problems(domain, contract)
    if problems:
        report.success, report.error = False, "; ".join(problems)
    return report


def domain_problems(domain: Domain, contract: Contract) -> list[str]:
    """What the data alone cannot show: a prompt that reads columns the contract does not guarantee,
    and verifier params the verifier refuses. Either would only fail at training time otherwise."""
    problems = []
    fields = set(template_columns(domain.prompt_template))  # plain names only: Domain checked that on load
    missing = sorted(fields - set(contract.columns))
    if missing:
        problems.append(f"prompt_template uses column(s) {', '.join(missing)} that contract {contract.name} "
                        f"does not declare (declared: {', '.join(contract.columns)})")
    try:
        get_verifier(domain.verifier.family, domain.verifier.params)
    except (TypeError, ValueError, KeyError) as e:
        problems.append(f"verifier {domain.verifier.family} refuses params {domain.verifier.params}: {e}")
    return problems


def validate_domains(domains: list[Domain], settings: Settings | None = None, *, build_docs: bool = True,
                     contracts: dict[str, Contract] | None = None, workers: int | None = None,
                     progress: bool = False) -> ValidationSummary:
    """Every domain through its contract; reports come back in the order of ``domains``.

    GX costs ~5 ms of pure Python per expectation run (its metric graph), ~60-120 ms for a
    domain (see ``data_contracts.runner``), so at hundreds of domains the checks are split into
    contiguous chunks run by ``workers`` processes, each with its own GX context (and, with docs,
    its own Data Docs site under ``part-<k>/``, linked from one index page). ``workers=None``
    picks one per CPU when there are enough domains to repay a worker's start-up (GX import
    ~3 s), else validates in this process. This process imports GX only when it validates
    itself: the workers import it in parallel, so a parent's import would only add to the wall.
    """
    settings = settings or get_settings()
    contracts = contracts if contracts is not None else load_contracts(settings.resolved_contracts_dir)
    docs_local = Path(tempfile.mkdtemp(prefix="temper-docs-"))
    workers = max(1, min(validation_workers(len(domains)) if workers is None else workers, len(domains)))
    pairs = [(d, contract_for(d, contracts)) for d in domains]
    if workers == 1:
        reports = _validate_chunk(pairs, settings, docs_local if build_docs else None, progress)
    else:
        size = -(-len(pairs) // workers)
        chunks = [pairs[i:i + size] for i in range(0, len(pairs), size)]
        parts = [docs_local / f"part-{k}" for k in range(len(chunks))] if build_docs else [None] * len(chunks)
        ctx = multiprocessing.get_context("spawn")  # the caller may run threads (Prefect): never fork them
        with ProcessPoolExecutor(len(chunks), mp_context=ctx) as pool:
            futures = [pool.submit(_validate_chunk, c, settings, part, False) for c, part in zip(chunks, parts)]
            reports = [r for f in futures for r in f.result()]
        if build_docs:
            _write_parts_index(docs_local, parts, chunks, reports)
    docs_uri = None
    if build_docs and any(r.expectations for r in reports):
        docs_uri = join(settings.resolved_storage_root, "validation", "data_docs")
        put_dir(str(docs_local), docs_uri, settings)
    return ValidationSummary(reports=reports, docs_uri=docs_uri, docs_local=docs_local if docs_uri else None)


PARALLEL_MIN_DOMAINS = 24  # below this a worker's start-up costs more than it saves


def _validate_chunk(pairs: list[tuple[Domain, Contract | None]], settings: Settings, docs_dir: Path | None,
                    progress: bool) -> list[DomainReport]:
    """One GX context validates a run of domains (in this process or a worker) and builds their docs."""
    from data_contracts.runner import GXRunner  # lazy: GX (~3 s) only where checks run

    runner = GXRunner(docs_dir=docs_dir)
    items = pairs
    if progress:
        # lazy: tqdm (30 ms) would load whenever flows.post_training is imported
        from tqdm import tqdm

        items = tqdm(pairs, desc="validate", unit="domain", leave=False, disable=None)  # None: off unless a TTY
    reports = [validate_domain(d, c, runner, settings) for d, c in items]
    if docs_dir is not None and any(r.expectations for r in reports):
        runner.build_docs()
    return reports


def _write_parts_index(root: Path, parts: list[Path], chunks: list[list[tuple[Domain, Contract | None]]],
                       reports: list[DomainReport]) -> None:
    """One page linking each worker's Data Docs site, with the domains it holds and which of them
    failed (at hundreds of domains the failing few are what a person opens the docs for)."""
    failed = {r.domain for r in reports if not r.success}
    items, failing = [], []
    for part, chunk in zip(parts, chunks):
        bad = [d.name for d, _ in chunk if d.name in failed]
        items.append(f'<li><a href="{part.name}/index.html">{html.escape(chunk[0][0].name)} .. '
                     f'{html.escape(chunk[-1][0].name)}</a> ({len(chunk)} domains, {len(bad)} failing)</li>')
        failing += [f'<li><a href="{part.name}/index.html">{html.escape(n)}</a></li>' for n in bad]
    summary = f"<h2>Failing domains ({len(failing)})</h2><ul>{''.join(failing)}</ul>" if failing else \
        "<p>Every domain passes its contract.</p>"
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.html").write_text(f"<!doctype html><title>temper data docs</title><h1>Data Docs</h1>{summary}"
                                     f"<h2>Sites</h2><ul>{''.join(items)}</ul>")


def validation_workers(n_domains: int) -> int:
    """Processes worth starting for ``n_domains`` checks: one per CPU once there are enough domains."""
    return max(1, min(os.cpu_count() or 1, n_domains // PARALLEL_MIN_DOMAINS))


class SharedValidator:
    """Validates one domain at a time for many concurrent callers: the flow's mapped tasks.

    The flow maps one Prefect task per domain (each cached by digest + contract hash), run on a
    thread pool. A GX context per task cost ~1 s, and GX is pure Python, so threads do not run
    checks in parallel: here one context serves every thread of this process (behind a lock),
    or, with ``workers > 1``, each of ``workers`` spawned processes holds one context and the
    threads' checks are spread over them.
    """

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self._lock = threading.Lock()
        self._runner: GXRunner | None = None
        self._pool: ProcessPoolExecutor | None = None
        if workers > 1:
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker_runner)

    def validate(self, domain: Domain, contract: Contract | None, settings: Settings) -> DomainReport:
        if self._pool is not None:
            return self._pool.submit(_validate_in_worker, domain, contract, settings).result()
        with self._lock:
            if self._runner is None:
                from data_contracts.runner import GXRunner  # lazy: GX (~3 s) only where checks run

                self._runner = GXRunner()
            return validate_domain(domain, contract, self._runner, settings)


_WORKER_RUNNER: GXRunner | None = None


def _init_worker_runner() -> None:
    from data_contracts.runner import GXRunner  # lazy: GX (~3 s) only in the worker that checks

    global _WORKER_RUNNER
    _WORKER_RUNNER = GXRunner()


def _validate_in_worker(domain: Domain, contract: Contract | None, settings: Settings) -> DomainReport:
    return validate_domain(domain, contract, _WORKER_RUNNER, settings)


@functools.lru_cache(maxsize=None)
def shared_validator(workers: int) -> SharedValidator:
    """The process-wide validator with ``workers`` processes (made once, reused by later flows)."""
    return SharedValidator(workers)


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
    settings = settings or get_settings()
    by_name = {d.name: d for d in domains}

    def read_again():
        for r in reports:
            if not r.digest:
                continue
            ds = load_dataset(by_name[r.domain], settings)
            if ds.digest != r.digest:
                raise DatasetError(f"dataset {ds.uri} changed after validation (sha256 {r.digest[:12]} -> "
                                   f"{ds.digest[:12]}); validate again")
            yield r.domain, ds.frame, ds.uri, ds.digest

    log_datasets(read_again(), context=context)


def track_validation(summary: ValidationSummary, domains: list[Domain], settings: Settings | None = None) -> None:
    """Log a validation to the active MLflow run: datasets as inputs, report and Data Docs as artifacts."""
    # lazy: mlflow (1.6 s) would load whenever flows.post_training is imported
    import mlflow

    log_validated_datasets(summary.reports, domains, CONTEXT_VALIDATION, settings)
    mlflow.log_metrics({f"contract_failures.{r.domain}": len(r.failures) + (1 if r.error else 0)
                        for r in summary.reports})  # batched: one request, not one per domain
    mlflow.log_dict(summary.to_dict(), "validation/report.json")
    mlflow.set_tag(TAG_DATA_VALIDATION, "pass" if summary.success else "fail")
    if summary.docs_local:
        mlflow.log_artifacts(str(summary.docs_local), "validation/data_docs")
