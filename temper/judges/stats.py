"""Judge-human agreement: Spearman's rho (ties get average ranks) and Cohen's kappa.

numpy/pandas only, so the gate does not depend on scipy being installed. Both return NaN
when agreement is undefined (fewer than two items, or one rater gave a single value
throughout): a constant judge has not shown it can tell good from bad, and the gate
treats NaN as "below threshold".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} vs {len(b)} values")
    if len(a) < 2:
        return math.nan
    ra = pd.Series(a, dtype=float).rank(method="average").to_numpy()
    rb = pd.Series(b, dtype=float).rank(method="average").to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def cohen_kappa(a: Sequence[int], b: Sequence[int], labels: Sequence[int]) -> float:
    """Unweighted kappa over the given categories (the rubric's scale points)."""
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa: {len(a)} vs {len(b)} values")
    if not a:
        return math.nan
    index = {v: i for i, v in enumerate(labels)}
    unknown = sorted({v for v in (*a, *b) if v not in index})
    if unknown:
        raise ValueError(f"cohen_kappa: values {unknown} are not among the categories {list(labels)}")
    m = np.zeros((len(labels), len(labels)))
    for x, y in zip(a, b):
        m[index[x], index[y]] += 1
    m /= m.sum()
    observed = float(np.trace(m))
    expected = float(m.sum(axis=1) @ m.sum(axis=0))
    if expected >= 1.0:
        return math.nan
    return (observed - expected) / (1.0 - expected)
