"""Calibration: does the judge agree with people? If not, its rewards are not trusted for RL.

Per open-ended domain: Spearman rank correlation of judge vs human scores and Cohen's kappa
on binned scores, with the sample size. A domain below its rubric's threshold is
'unverified' and, by policy, excluded from RL or down-weighted until a new calibration
passes. Results live in MLflow (experiment ``judge_calibration``, one run per calibration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

EXPERIMENT = "judge_calibration"
TAG_DOMAIN = "temper.domain"
TAG_STATUS = "temper.calibration.status"


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), 1-based."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Pearson correlation of average ranks; 0.0 when either side is constant."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def cohen_kappa(a: list[int], b: list[int]) -> float:
    """(observed - chance agreement) / (1 - chance); 1.0 when both raters use one same label only."""
    labels = sorted(set(a) | set(b))
    index = {label: i for i, label in enumerate(labels)}
    m = np.zeros((len(labels), len(labels)))
    for x, y in zip(a, b):
        m[index[x], index[y]] += 1
    n = m.sum()
    observed = np.trace(m) / n
    chance = float((m.sum(0) * m.sum(1)).sum() / n**2)
    return 1.0 if chance == 1.0 else float((observed - chance) / (1 - chance))


def bin_scores(scores: list[float], lo: float, hi: float, bins: int) -> list[int]:
    """Scale scores -> bins equal-width bins over [lo, hi] (0 .. bins-1)."""
    width = (hi - lo) / bins
    return [min(bins - 1, int((s - lo) / width)) for s in scores]


@dataclass(frozen=True)
class CalibrationResult:
    domain: str
    n: int
    spearman: float
    kappa: float
    threshold: float
    run_id: str | None = None

    @property
    def verified(self) -> bool:
        return self.n >= 2 and self.spearman >= self.threshold


def agreement(domain: str, judge: list[float], human: list[float], *, scale: tuple[int, int], threshold: float,
              bins: int = 3) -> CalibrationResult:
    if len(judge) != len(human):
        raise ValueError(f"{domain}: {len(judge)} judge scores vs {len(human)} human scores")
    if not judge:
        return CalibrationResult(domain, 0, 0.0, 0.0, threshold)
    lo, hi = scale
    return CalibrationResult(domain, len(judge), spearman(judge, human),
                             cohen_kappa(bin_scores(judge, lo, hi, bins), bin_scores(human, lo, hi, bins)), threshold)


def log_calibration(result: CalibrationResult, labels_digest: str | None = None) -> str:
    """One MLflow run per calibration; returns its id."""
    import mlflow

    from infra import lineage

    lineage.configure()
    lineage.use_experiment(EXPERIMENT)
    status = "verified" if result.verified else "unverified"
    with mlflow.start_run(run_name=f"calibrate-{result.domain}",
                          tags={TAG_DOMAIN: result.domain, TAG_STATUS: status,
                                **({lineage.TAG_SHA256: labels_digest} if labels_digest else {})}) as run:
        mlflow.log_metrics({"spearman": result.spearman, "kappa": result.kappa, "n": result.n,
                            "threshold": result.threshold})
        return run.info.run_id


def calibration_status(domain_names: list[str]) -> dict[str, CalibrationResult]:
    """The latest calibration per domain (domains never calibrated are absent)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return {}
    out: dict[str, CalibrationResult] = {}
    for name in domain_names:
        runs = client.search_runs([exp.experiment_id], f"tags.`{TAG_DOMAIN}` = '{name}'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        if runs:
            m = runs[0].data.metrics
            out[name] = CalibrationResult(name, int(m.get("n", 0)), m.get("spearman", 0.0), m.get("kappa", 0.0),
                                          m.get("threshold", 1.0), runs[0].info.run_id)
    return out


class CalibrationPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["exclude", "downweight"] = Field(default="exclude",
                                                   description="What happens to an unverified judge domain.")
    downweight: float = Field(default=0.1, gt=0, le=1, description="Weight factor in 'downweight' mode.")


def apply_calibration_gate(domains: list, statuses: dict[str, CalibrationResult],
                           policy: CalibrationPolicy) -> tuple[dict[str, float], dict[str, str]]:
    """(domain -> sampling weight kept, domain -> why excluded or down-weighted).

    Only judge-scored domains are gated; a mechanically verified domain always passes.
    """
    kept: dict[str, float] = {}
    flagged: dict[str, str] = {}
    for d in domains:
        weight = d.sampling_ratio
        if d.verifier.family != "judge":
            kept[d.name] = weight
            continue
        s = statuses.get(d.name)
        if s is None:
            reason = "judge never calibrated against human labels"
        elif not s.verified:
            reason = f"judge-human Spearman {s.spearman:.2f} < {s.threshold:.2f} (n={s.n}, kappa {s.kappa:.2f})"
        else:
            kept[d.name] = weight
            continue
        if policy.mode == "downweight":
            kept[d.name] = weight * policy.downweight
            flagged[d.name] = f"down-weighted x{policy.downweight}: {reason}"
        else:
            flagged[d.name] = f"excluded: {reason}"
    return kept, flagged
