"""Paired bootstrap of a per-sample reward delta, and the Holm correction over many domains.

Why: one domain's mean reward on 64 eval items has a standard error near 0.09, so a point
delta alone is noise. ``temper models compare`` shows the interval; the gate tests each domain
for a regression and corrects for the number of domains (300 domains at 5% each would
otherwise see ~15 'regressions' between two identical models).

The resampling is ``scipy.stats.bootstrap`` (percentile intervals, seeded). The one-sided
p-value of "B is worse than A" is a normal approximation with the bootstrap standard error:
exact enough at tens of items, and unlike a count of resamples it can be small enough to
survive Holm over hundreds of domains without hundreds of thousands of resamples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95

Samples = list[tuple[str, float | None]]


@dataclass(frozen=True)
class DeltaInterval:
    """Bootstrap interval of mean reward (B - A) on one domain."""

    delta: float
    lo: float
    hi: float
    level: float
    paired: bool
    n_a: int
    n_b: int
    se: float = 0.0  # bootstrap standard error of the delta

    def p_worse(self) -> float:
        """One-sided p-value of H0 'B is not worse than A' (small = B significantly worse)."""
        if self.se > 0:
            return float(stats.norm.cdf(self.delta / self.se))
        return 0.0 if self.delta < 0 else 1.0  # every resample agrees: certain either way


def _diff_of_means(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return y.mean(axis=axis) - x.mean(axis=axis)


def bootstrap_delta(a: Samples, b: Samples, *, n_boot: int = 2000, level: float = CONFIDENCE,
                    seed: int = 0) -> DeltaInterval | None:
    """Percentile bootstrap of mean(B) - mean(A) over per-sample rewards; None if either side is empty.

    Paired (resample sample ids, difference per id) when both were scored on the same ids,
    which is the normal case (same eval split) and much tighter; independent resampling otherwise.
    Unscored samples (reward None) are left out, as in the mean reward itself.
    """
    ra = {i: r for i, r in a if r is not None}
    rb = {i: r for i, r in b if r is not None}
    if not ra or not rb:
        return None
    paired = ra.keys() == rb.keys()
    rng = np.random.default_rng(seed)
    kw = dict(n_resamples=n_boot, confidence_level=level, method="percentile", vectorized=True, random_state=rng)
    if paired:
        ids = sorted(ra)
        diff = np.array([rb[i] - ra[i] for i in ids])
        point = float(diff.mean())
        if len(diff) < 2 or np.ptp(diff) == 0:  # scipy needs 2+ distinct values; every resample is the mean
            return DeltaInterval(point, point, point, level, True, len(ra), len(rb), 0.0)
        res = stats.bootstrap((diff,), np.mean, **kw)
    else:
        va, vb = np.array(list(ra.values())), np.array(list(rb.values()))
        point = float(vb.mean() - va.mean())
        if min(len(va), len(vb)) < 2 or (np.ptp(va) == 0 and np.ptp(vb) == 0):
            return DeltaInterval(point, point, point, level, False, len(ra), len(rb), 0.0)
        res = stats.bootstrap((va, vb), _diff_of_means, **kw)
    ci = res.confidence_interval
    return DeltaInterval(delta=point, lo=float(ci.low), hi=float(ci.high), level=level, paired=paired,
                         n_a=len(ra), n_b=len(rb), se=float(res.standard_error))


def holm(p_values: dict[str, float], alpha: float) -> set[str]:
    """Holm-Bonferroni step-down: the keys whose null is rejected at family-wise error rate ``alpha``."""
    rejected = set()
    m = len(p_values)
    for i, (key, p) in enumerate(sorted(p_values.items(), key=lambda kv: kv[1])):
        if p > alpha / (m - i):
            break
        rejected.add(key)
    return rejected


def bonferroni(p_values: dict[str, float], alpha: float) -> set[str]:
    return {k for k, p in p_values.items() if p <= alpha / max(len(p_values), 1)}
