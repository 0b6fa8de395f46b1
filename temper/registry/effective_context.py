"""Effective context length: the longest prompt length at which a model stays nearly as accurate as it is
on short prompts, with a confidence interval.

A context window is a ceiling, not a measurement. Given per-item results of a long-context domain
(each item's prompt length in tokens and its reward), accuracy is taken per length; the effective
length is the longest length L such that at every length up to L accuracy is at least ``fraction`` of
the shortest length's accuracy (the threshold style of RULER-like evals, relative to the model's own
short-context skill, so a weak model is not called "long-context" for being equally bad everywhere).
When short-context accuracy is below ``min_short`` the curve is noise, and the answer is "not
measurable" rather than a number.

The interval comes from resampling items within each length (scipy's bootstrap, percentile method:
the statistic is a step function of the data, which BCa's jackknife does not suit). Two versions
differ in effective context only when their intervals do not overlap; that is the gate's rule.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

Curve = list[tuple[int, float | None]]  # (prompt tokens, reward) per eval item; None = not scored
FRACTION = 0.8
MIN_SHORT = 0.2
CONFIDENCE = 0.95


@dataclass
class EffectiveContext:
    lengths: list[int]
    n: list[int]
    accuracy: list[float]
    ci_low: list[float]  # Wilson interval of each length's accuracy
    ci_high: list[float]
    short_accuracy: float
    effective_tokens: int | None  # None: not measurable
    interval: tuple[int, int] | None = None  # bootstrap interval of effective_tokens
    fraction: float = FRACTION
    min_short: float = MIN_SHORT
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def measurable(self) -> bool:
        return self.effective_tokens is not None

    def describe(self) -> str:
        if not self.measurable:
            return f"not measurable ({self.note})"
        lo, hi = self.interval or (self.effective_tokens, self.effective_tokens)
        return f"{self.effective_tokens} tokens ({CONFIDENCE:.0%} CI [{lo}, {hi}])"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"measurable": self.measurable, "describe": self.describe()}


def _by_length(curve: Curve) -> tuple[list[int], list[np.ndarray]]:
    cells: dict[int, list[float]] = defaultdict(list)
    for tokens, reward in curve:
        cells[int(tokens)].append(0.0 if reward is None else float(reward))  # unscored counts as wrong
    lengths = sorted(cells)
    return lengths, [np.asarray(cells[n]) for n in lengths]


def effective_tokens(lengths: list[int], accuracy: list[float], fraction: float = FRACTION,
                     min_short: float = MIN_SHORT) -> int | None:
    """The longest length whose accuracy, and every shorter length's, is at least ``fraction`` of the
    shortest length's; None when the shortest length's accuracy is below ``min_short``."""
    if not lengths or accuracy[0] < min_short:
        return None
    bar = fraction * accuracy[0]
    best = lengths[0]
    for n, acc in zip(lengths, accuracy):
        if acc < bar:
            break
        best = n
    return best


def effective_context(curve: Curve, fraction: float = FRACTION, min_short: float = MIN_SHORT,
                      confidence: float = CONFIDENCE, n_resamples: int = 2000, seed: int = 0) -> EffectiveContext:
    """Accuracy per length with Wilson intervals, the effective length, and its bootstrap interval."""
    lengths, cells = _by_length(curve)
    if not lengths:
        return EffectiveContext([], [], [], [], [], 0.0, None, fraction=fraction, min_short=min_short,
                                note="no scored items")
    accuracy = [float(c.mean()) for c in cells]
    lows, highs = [], []
    for c in cells:
        ci = stats.binomtest(int(round(c.sum())), len(c)).proportion_ci(confidence, method="wilson")
        lows.append(float(ci.low))
        highs.append(float(ci.high))
    point = effective_tokens(lengths, accuracy, fraction, min_short)
    result = EffectiveContext(lengths, [len(c) for c in cells], accuracy, lows, highs, accuracy[0], point,
                              fraction=fraction, min_short=min_short)
    if point is None:
        result.note = f"short-context accuracy {accuracy[0]:.2f} at {lengths[0]} tokens is below {min_short}"
        return result
    if len(lengths) == 1:
        result.interval = (point, point)
        result.note = "one length only"
        return result

    def statistic(*samples: np.ndarray) -> float:
        # a resample whose short-context accuracy falls under the floor has no usable context: 0 tokens
        return float(effective_tokens(lengths, [s.mean() for s in samples], fraction, min_short) or 0)

    boot = stats.bootstrap(tuple(cells), statistic, n_resamples=n_resamples, confidence_level=confidence,
                           method="percentile", vectorized=False, paired=False, rng=np.random.default_rng(seed))
    lo, hi = boot.confidence_interval
    result.interval = (int(np.nan_to_num(lo, nan=point)), int(np.nan_to_num(hi, nan=point)))
    return result


def lost_context(candidate: EffectiveContext, champion: EffectiveContext) -> bool:
    """The candidate's effective length is lower than the champion's beyond doubt: both measurable and the
    intervals apart. A champion that was not measurable has nothing to lose."""
    if not (candidate.measurable and champion.measurable and candidate.interval and champion.interval):
        return False
    return candidate.interval[1] < champion.interval[0]


def context_figure(ec: EffectiveContext, title: str):
    """Accuracy against prompt length with each length's interval, the bar (``fraction`` of short-context
    accuracy) and the effective length marked: what a person reads before trusting a long-context claim."""
    # lazy: matplotlib (600 ms) only when a long-context eval is recorded
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib (600 ms) only when a long-context eval is recorded
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    acc = np.asarray(ec.accuracy)
    err = np.clip([acc - np.asarray(ec.ci_low), np.asarray(ec.ci_high) - acc], 0, None)
    ax.errorbar(ec.lengths, acc, yerr=err, marker="o", capsize=4, label="accuracy (Wilson CI)")
    if ec.lengths:
        ax.axhline(ec.fraction * ec.short_accuracy, color="grey", linestyle="--",
                   label=f"{ec.fraction:.0%} of short-context accuracy")
    if ec.measurable:
        ax.axvline(ec.effective_tokens, color="tab:green", label=f"effective: {ec.describe()}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{title}: {ec.describe()}" if not ec.measurable else title, fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig
