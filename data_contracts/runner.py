"""Run contracts through Great Expectations and report what failed, where, on which values.

One ephemeral GX context per process: suites and assets are added per domain, which is
cheap (the benchmark measures it); the context itself costs ~1 s to build.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import great_expectations as gx
import pandas as pd
from great_expectations.data_context.types.base import ProgressBarsConfig

from data_contracts.compiler import compile_suite, prepare_frame
from data_contracts.model import Contract

_MAX_SAMPLES = 5


@dataclass
class Failure:
    check: str
    column: str | None
    expectation: str
    unexpected_count: int | None
    unexpected_percent: float | None
    sample_values: list[Any]
    observed: Any = None


@dataclass
class DomainReport:
    domain: str
    contract: str
    dataset_uri: str
    digest: str
    rows: int
    success: bool
    expectations: int
    failures: list[Failure] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GXRunner:
    """Holds one GX context; ``validate`` may be called for many domains."""

    def __init__(self, docs_dir: Path | None = None) -> None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        logging.getLogger("great_expectations").setLevel(logging.WARNING)

        self._gx = gx
        self.ctx = gx.get_context(mode="ephemeral")
        self.ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
        self.source = self.ctx.data_sources.add_pandas("temper")
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
        self._n = 0

    def validate(self, domain: str, contract: Contract, frame: pd.DataFrame, *, dataset_uri: str,
                 digest: str) -> DomainReport:
        self._n += 1
        key = f"{domain}-{self._n}"
        prepared = prepare_frame(contract, frame)
        suite = self.ctx.suites.add(compile_suite(contract, name=f"{contract.name}-{key}"))
        batch_def = self.source.add_dataframe_asset(name=key).add_batch_definition_whole_dataframe(key)
        vd = self.ctx.validation_definitions.add(
            self._gx.ValidationDefinition(name=key, data=batch_def, suite=suite))
        result = vd.run(batch_parameters={"dataframe": prepared},
                        result_format={"result_format": "SUMMARY", "partial_unexpected_count": _MAX_SAMPLES})
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
