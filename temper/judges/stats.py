"""Judge-human agreement: Spearman's rho (ties get average ranks) and Cohen's kappa.

Thin over ``scipy.stats.spearmanr`` and ``sklearn.metrics.cohen_kappa_score`` (both installed
with MLflow). What this module adds is the calibration gate's contract: both return NaN when
agreement is undefined (fewer than two items, or one rater gave a single value throughout),
without a warning: a constant judge has not shown it can tell good from bad, and the gate
treats NaN as "below threshold". Kappa also refuses values outside the rubric's scale, by name.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

from scipy.stats import spearmanr
from sklearn.metrics import cohen_kappa_score


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} vs {len(b)} values")
    if len(a) < 2 or len(set(a)) < 2 or len(set(b)) < 2:  # scipy would warn and return NaN
        return math.nan
    return float(spearmanr(a, b).statistic)


def cohen_kappa(a: Sequence[int], b: Sequence[int], labels: Sequence[int]) -> float:
    """Unweighted kappa over the given categories (the rubric's scale points)."""
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa: {len(a)} vs {len(b)} values")
    if not a:
        return math.nan
    unknown = sorted({v for v in (*a, *b) if v not in set(labels)})
    if unknown:
        raise ValueError(f"cohen_kappa: values {unknown} are not among the categories {list(labels)}")
    with warnings.catch_warnings():  # undefined kappa is NaN by contract, not news
        warnings.simplefilter("ignore")
        return float(cohen_kappa_score(a, b, labels=list(labels), replace_undefined_by=math.nan))
