"""Judge calibration: agreement with human labels per domain, logged to MLflow, and the RL gate.

One MLflow run per (domain, calibration) in the experiment ``judge_calibration`` with tags
``temper.domain``, ``temper.calibration.status`` (verified | unverified), the rubric digest
and the judge identity, and metrics ``spearman``, ``kappa``, ``n``.

The gate (``apply_calibration_gate``) re-checks the latest run's metrics against the
thresholds in force *now* (policy default < rubric ``calibration:`` < domain
``verifier.params.calibration``), and treats a calibration made with another rubric version
or another judge as missing: agreement is a property of that exact pair. Only domains whose
verifier family is ``judge`` are gated; everything else passes through unchanged.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from temper.core.errors import TemperError
from temper.core.tag_names import (
    CONTEXT_CALIBRATION,
    TAG_CALIBRATION_REASON,
    TAG_CALIBRATION_STATUS,
    TAG_DOMAIN,
    TAG_JUDGE,
    TAG_LABELS,
    TAG_RUBRIC,
)
from temper.judges.judge import Judge
from temper.judges.params import parse_params
from temper.judges.rubric import CalibrationOverrides, Rubric, Scale
from temper.judges.stats import cohen_kappa, spearman

if TYPE_CHECKING:
    import pandas as pd

    from temper.core.settings import Settings
    from temper.data.domain import Domain

log = logging.getLogger(__name__)

EXPERIMENT = "judge_calibration"
Status = Literal["verified", "unverified", "missing"]


class CalibrationPolicy(BaseModel):
    """Thresholds and what happens to a judge domain that does not meet them."""

    model_config = ConfigDict(extra="forbid")

    min_spearman: float = Field(default=0.5, ge=-1, le=1, description="Lowest acceptable Spearman rho.")
    min_kappa: float = Field(default=0.4, ge=-1, le=1, description="Lowest acceptable Cohen's kappa (scale points).")
    min_n: int = Field(default=20, ge=2, description="Fewest human-labelled items a calibration needs.")
    mode: Literal["exclude", "downweight"] = Field(
        default="exclude", description="exclude: drop an unverified domain from RL; downweight: keep it at factor x.")
    factor: float = Field(default=0.25, gt=0, le=1, description="Sampling-weight multiplier in downweight mode.")

    def merged(self, *overrides: CalibrationOverrides) -> "CalibrationPolicy":
        update: dict[str, Any] = {}
        for o in overrides:
            update.update(o.model_dump(exclude_none=True))
        return self.model_copy(update=update)


@dataclass(frozen=True)
class Agreement:
    n: int
    spearman: float
    kappa: float


@dataclass(frozen=True)
class CalibrationResult:
    domain: str
    status: Status
    n: int = 0
    spearman: float = math.nan
    kappa: float = math.nan
    run_id: str | None = None
    rubric_digest: str | None = None
    judge_id: str | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agreement(judge_scores: list[float], human_scores: list[int], scale: Scale) -> Agreement:
    """Spearman on the judge's [0, 1] scores vs human scale points; kappa after binning the judge to scale points."""
    binned = [scale.to_point(s) for s in judge_scores]
    return Agreement(n=len(human_scores), spearman=spearman(judge_scores, human_scores),
                     kappa=cohen_kappa(binned, list(human_scores), scale.points))


def shortfalls(a: Agreement | CalibrationResult, policy: CalibrationPolicy) -> list[str]:
    """Every threshold the agreement misses, in words; empty means verified. NaN never passes."""
    out = []
    if a.n < policy.min_n:
        out.append(f"n={a.n} < min_n={policy.min_n}")
    for name, value, floor in (("spearman", a.spearman, policy.min_spearman), ("kappa", a.kappa, policy.min_kappa)):
        if not math.isfinite(value):
            out.append(f"{name} undefined (a rater gave one value throughout)")
        elif value < floor:
            out.append(f"{name}={value:.3f} < {floor}")
    return out


def log_calibration(domain: str, a: Agreement, policy: CalibrationPolicy, *, rubric_digest: str, judge_id: str,
                    labels: "pd.DataFrame", labels_uri: str, labels_sha256: str,
                    settings: "Settings | None" = None) -> CalibrationResult:
    """One run in ``judge_calibration``: metrics, thresholds as params, the label dataset as input."""
    # lazy: mlflow+pydantic_settings (1.7 s), via infra.tracking, would load in test_judges_calibration.py
    import mlflow

    from infra.tracking.connection import configure
    from infra.tracking.runs import close_run, log_dataset, open_run, resume_run
    from temper.core.tag_names import TAG_KIND

    configure(settings)
    missed = shortfalls(a, policy)
    status: Status = "unverified" if missed else "verified"
    reason = "; ".join(missed)
    tags = {TAG_KIND: "calibration", TAG_DOMAIN: domain, TAG_CALIBRATION_STATUS: status,
            TAG_CALIBRATION_REASON: reason[:4000], TAG_RUBRIC: rubric_digest, TAG_JUDGE: judge_id,
            TAG_LABELS: labels_sha256}
    run_id = open_run(EXPERIMENT, f"calibrate-{domain}", tags=tags)
    try:
        with resume_run(run_id):
            metrics = {"n": float(a.n), "spearman": a.spearman, "kappa": a.kappa}
            mlflow.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)})
            mlflow.log_params(policy.model_dump())
            log_dataset(f"human_labels/{domain}", labels, labels_uri, labels_sha256, context=CONTEXT_CALIBRATION)
    except BaseException:
        close_run(run_id, "FAILED")
        raise
    close_run(run_id)
    return CalibrationResult(domain=domain, status=status, n=a.n, spearman=a.spearman, kappa=a.kappa, run_id=run_id,
                             rubric_digest=rubric_digest, judge_id=judge_id, reason=reason)


def calibration_status(domain_names: list[str], settings: "Settings | None" = None) -> dict[str, CalibrationResult]:
    """The latest finished calibration of each domain ('missing' when there is none)."""
    # lazy: mlflow+pydantic_settings (1.7 s), via infra.tracking, would load in test_judges_calibration.py
    from mlflow.tracking import MlflowClient

    from infra.tracking.connection import configure

    configure(settings)
    client = MlflowClient()
    exp = client.get_experiment_by_name(EXPERIMENT)
    out: dict[str, CalibrationResult] = {}
    for name in domain_names:
        runs = []
        if exp is not None:
            quoted = name.replace("\\", "\\\\").replace("'", "\\'")
            where = f"tags.`{TAG_DOMAIN}` = '{quoted}' and attributes.status = 'FINISHED'"
            runs = client.search_runs([exp.experiment_id], filter_string=where, max_results=1,
                                      order_by=["attributes.start_time DESC"])
        if not runs:
            out[name] = CalibrationResult(domain=name, status="missing", reason="never calibrated")
            continue
        r = runs[0]
        m, t = r.data.metrics, r.data.tags
        out[name] = CalibrationResult(
            domain=name, status=t.get(TAG_CALIBRATION_STATUS, "unverified"), n=int(m.get("n", 0)),
            spearman=m.get("spearman", math.nan), kappa=m.get("kappa", math.nan), run_id=r.info.run_id,
            rubric_digest=t.get(TAG_RUBRIC), judge_id=t.get(TAG_JUDGE), reason=t.get(TAG_CALIBRATION_REASON, ""))
    return out


def domain_policy(domain: "Domain", policy: CalibrationPolicy) -> tuple[CalibrationPolicy, Rubric, str]:
    """A judge domain's effective thresholds, its rubric and its judge identity (raises on bad config)."""
    params, rubric = parse_params(domain.verifier.params)
    return policy.merged(rubric.calibration, params.calibration), rubric, Judge(params.judge).identity


def gate_reason(result: CalibrationResult | None, policy: CalibrationPolicy, rubric_digest: str,
                judge_id: str) -> str | None:
    """Why a judge domain is unverified now, or None when its latest calibration passes."""
    if result is None or result.status == "missing":
        return "judge never calibrated against human labels"
    if result.rubric_digest != rubric_digest:
        return f"latest calibration ({result.run_id}) used another rubric version"
    if result.judge_id != judge_id:
        return f"latest calibration ({result.run_id}) used another judge ({result.judge_id})"
    missed = shortfalls(result, policy)
    return f"judge-human agreement below threshold: {'; '.join(missed)} (run {result.run_id})" if missed else None


def apply_calibration_gate(domains: list["Domain"], statuses: dict[str, CalibrationResult],
                           policy: CalibrationPolicy | None = None,
                           base_weights: dict[str, float] | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """(kept domain -> sampling weight, excluded domain -> reason).

    The weight starts from ``base_weights`` (e.g. PostTrainingParams.mixing_weights) or the
    domain's ``sampling_ratio``; an unverified judge domain in downweight mode keeps
    ``factor`` x that weight. A judge domain whose rubric or judge cannot even be loaded is
    excluded whatever the mode: it could not be scored.
    """
    policy = policy or CalibrationPolicy()
    base_weights = base_weights or {}
    kept: dict[str, float] = {}
    excluded: dict[str, str] = {}
    for d in domains:
        weight = float(base_weights.get(d.name, d.sampling_ratio))
        if d.verifier.family != "judge":
            kept[d.name] = weight
            continue
        try:
            effective, rubric, judge_id = domain_policy(d, policy)
        except TemperError as e:
            excluded[d.name] = f"judge configuration unusable: {e}"
            continue
        reason = gate_reason(statuses.get(d.name), effective, rubric.digest, judge_id)
        if reason is None:
            kept[d.name] = weight
        elif effective.mode == "downweight":
            kept[d.name] = weight * effective.factor
            log.warning("domain %s down-weighted x%s: %s", d.name, effective.factor, reason)
        else:
            excluded[d.name] = reason
    return kept, excluded
