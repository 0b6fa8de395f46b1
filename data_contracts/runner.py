"""Run contracts through Great Expectations and report what failed, where, on which values.

One ephemeral GX context per process (~1 s to build), reused for every domain. What a domain
costs is GX's pure-Python work per expectation run (~5 ms each for its metric graph, whatever
the row count; a 1,000-row domain of the arithmetic contract runs 23), so the runner does
nothing per domain that it can do once:

- one suite and validation definition per distinct contract, not per domain (compiling and
  adding them cost ~30 ms per domain); the domain is named by the run (``run_name``), which is
  what Data Docs list;
- one dataframe asset for all domains (adding an asset re-serialises the project config);
- a pass/fail run first (``BOOLEAN_ONLY``: ~60% of a ``SUMMARY`` run, no unexpected-value
  lists), and the ``SUMMARY`` run, with counts and samples, only for a domain that failed,
  under the same run id (it replaces the pass/fail result): the report is the same, the cost
  of detail is paid where there is something to show. In Data Docs a passing domain's page
  lists every expectation as met, without observed values; a failing domain's page has them.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import great_expectations as gx
import pandas as pd
from great_expectations.core.run_identifier import RunIdentifier
from great_expectations.data_context.types.base import ProgressBarsConfig

from data_contracts.compiler import compile_suite, prepare_frame
from data_contracts.model import Contract
from data_contracts.report import DomainReport, Failure

__all__ = ["DomainReport", "Failure", "GXRunner"]

_MAX_SAMPLES = 5
_SUMMARY = {"result_format": "SUMMARY", "partial_unexpected_count": _MAX_SAMPLES}


class GXRunner:
    """Holds one GX context; ``validate`` may be called for many domains.

    ``screen=False`` runs every domain with ``SUMMARY`` details (~1.5x the cost): Data Docs then
    show observed values for passing domains too.
    """

    def __init__(self, docs_dir: Path | None = None, *, screen: bool = True) -> None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        logging.getLogger("great_expectations").setLevel(logging.WARNING)

        self._gx = gx
        self.screen = screen
        self.ctx = gx.get_context(mode="ephemeral")
        self.ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
        self.source = self.ctx.data_sources.add_pandas("temper")
        self._batch = self.source.add_dataframe_asset(name="domain").add_batch_definition_whole_dataframe("domain")
        self._definitions: dict[str, Any] = {}  # contract JSON -> its ValidationDefinition
        self.docs_dir = docs_dir or Path(tempfile.mkdtemp(prefix="temper-gx-docs-"))
        self.ctx.add_data_docs_site(
            site_name="temper_docs",
            site_config={
                "class_name": "SiteBuilder",
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
                "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                                  "base_directory": str(self.docs_dir)},
            },
        )

    def _definition(self, contract: Contract):
        """The validation definition of this exact contract, made on first use."""
        key = contract.model_dump_json()
        vd = self._definitions.get(key)
        if vd is None:
            # a contract edited while this runner lives gets a suite of its own (names must be unique)
            name = f"contract-{contract.name}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
            suite = self.ctx.suites.add(compile_suite(contract, name=name))
            vd = self.ctx.validation_definitions.add(self._gx.ValidationDefinition(name=name, data=self._batch,
                                                                                   suite=suite))
            self._definitions[key] = vd
        return vd

    def validate(self, domain: str, contract: Contract, frame: pd.DataFrame, *, dataset_uri: str,
                 digest: str) -> DomainReport:
        prepared = prepare_frame(contract, frame)
        vd = self._definition(contract)
        # one run id per domain: the detailed re-run of a failing domain replaces its pass/fail result
        run_id = RunIdentifier(run_name=domain, run_time=datetime.datetime.now(datetime.timezone.utc))
        batch = {"dataframe": prepared}
        result = vd.run(batch_parameters=batch, result_format="BOOLEAN_ONLY" if self.screen else _SUMMARY,
                        run_id=run_id)
        if self.screen and not result.success:
            result = vd.run(batch_parameters=batch, result_format=_SUMMARY, run_id=run_id)
        failures = [self._failure(r, prepared) for r in result.results if not r.success]
        return DomainReport(domain=domain, contract=contract.name, dataset_uri=dataset_uri, digest=digest,
                            rows=len(frame), success=bool(result.success), expectations=len(result.results),
                            failures=failures)

    @staticmethod
    def _failure(r, prepared: pd.DataFrame) -> Failure:
        cfg = r.expectation_config
        meta = cfg.meta or {}
        res = r.result or {}
        column = meta.get("column")
        samples = list(res.get("partial_unexpected_list") or [])[:_MAX_SAMPLES]
        derived = cfg.kwargs.get("column", "")
        if derived.startswith("__rule__") and column in prepared:
            # The derived column's unexpected values are all False: show the data instead.
            bad = prepared.loc[~prepared[derived].astype(bool), column]
            samples = [_short(v) for v in bad.head(_MAX_SAMPLES)]
        if r.exception_info and r.exception_info.get("raised_exception"):
            res = {**res, "observed_value": r.exception_info.get("exception_message")}
        return Failure(check=meta.get("check", "?"), column=column, expectation=cfg.type,
                       unexpected_count=res.get("unexpected_count"),
                       unexpected_percent=_round(res.get("unexpected_percent")),
                       sample_values=[_short(v) for v in samples], observed=_short(res.get("observed_value")))

    def build_docs(self) -> Path:
        self.ctx.build_data_docs(site_names=["temper_docs"])
        return self.docs_dir


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def _short(v: Any, limit: int = 80) -> Any:
    if isinstance(v, str) and len(v) > limit:
        return v[:limit] + "..."
    if hasattr(v, "item"):
        return v.item()
    return v
