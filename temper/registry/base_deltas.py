"""What a post-training run did to its base model, per domain, with the uncertainty of 32-64 eval items.

A run over tens of domains always shows some deltas up and some down; only intervals say which are
real. Each domain's delta (candidate - base, same eval items) gets the paired bootstrap interval of
``bootstrap_delta`` (at 1 - alpha, not adjusted for the number of domains); the verdict is a two-sided
test per domain, Holm-corrected over the domains, so at 80 domains the chance of calling any unchanged
domain better or worse stays at ``alpha``. The mean over a set
of domains (the trained ones, the held-out ones) gets its own interval from a stratified bootstrap:
every resample redraws each domain's items, so domains weigh equally, as in the mean itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from temper.registry.bootstrap import CONFIDENCE, DeltaInterval, Samples, bootstrap_delta, holm

VERDICTS = ("better", "unchanged", "worse")


@dataclass(frozen=True)
class DomainDelta:
    domain: str
    base: float
    candidate: float
    delta: float
    lo: float
    hi: float
    verdict: str  # better / unchanged / worse, after Holm

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MeanDelta:
    """Mean over domains of (candidate - base), with its stratified bootstrap interval."""

    domains: int
    base: float
    candidate: float
    delta: float
    lo: float
    hi: float


def _mean(samples: Samples) -> float:
    scored = [r for _, r in samples if r is not None]
    return sum(scored) / len(scored) if scored else 0.0


def _paired(a: Samples, b: Samples) -> tuple[Samples, Samples]:
    """The items both sides scored: one unscored item must not turn a paired comparison into an unpaired one."""
    ra = {i: r for i, r in a if r is not None}
    rb = {i: r for i, r in b if r is not None}
    shared = sorted(ra.keys() & rb.keys())
    return [(i, ra[i]) for i in shared], [(i, rb[i]) for i in shared]


def p_two_sided(interval: DeltaInterval) -> float:
    """Two-sided p-value of 'no change' (normal approximation with the bootstrap standard error). With no spread
    at all (every item moved by the same amount) the bootstrap says nothing; the sign test does: n items all in
    one direction happen with probability 2 * 0.5**n under no change (0.125 at n=4, 5e-10 at n=32)."""
    if interval.se > 0:
        return float(2 * stats.norm.sf(abs(interval.delta) / interval.se))
    return 1.0 if interval.delta == 0 else min(1.0, 2 * 0.5 ** interval.n_a)


def domain_deltas(base: dict[str, Samples], candidate: dict[str, Samples], alpha: float = 0.05,
                  seed: int = 0) -> dict[str, DomainDelta]:
    """Per domain evaluated on both sides: the paired interval (items both sides scored) and the verdict: a
    two-sided test, Holm over the domains at ``alpha``, its direction the delta's sign."""
    pairs = {d: _paired(base[d], candidate[d]) for d in sorted(candidate) if d in base}
    intervals = {d: bootstrap_delta(a, b, seed=seed, level=1 - alpha) for d, (a, b) in pairs.items()}
    intervals = {d: i for d, i in intervals.items() if i is not None}
    changed = holm({d: p_two_sided(i) for d, i in intervals.items()}, alpha)
    return {d: DomainDelta(d, _mean(pairs[d][0]), _mean(pairs[d][1]), i.delta, i.lo, i.hi,
                           "unchanged" if d not in changed else "better" if i.delta > 0 else "worse")
            for d, i in intervals.items()}


def mean_delta(base: dict[str, Samples], candidate: dict[str, Samples], domains: list[str], n_boot: int = 2000,
               level: float = CONFIDENCE, seed: int = 0) -> MeanDelta | None:
    """The unweighted mean over ``domains`` of the paired per-item delta, with a percentile interval from
    resampling each domain's items (None when no domain has paired items)."""
    rng = np.random.default_rng(seed)
    means, boots, bases, cands = [], [], [], []
    for d in domains:
        a = {i: r for i, r in base.get(d, []) if r is not None}
        b = {i: r for i, r in candidate.get(d, []) if r is not None}
        ids = sorted(a.keys() & b.keys())
        if not ids:
            continue
        diff = np.array([b[i] - a[i] for i in ids])
        means.append(diff.mean())
        bases.append(np.mean([a[i] for i in ids]))
        cands.append(np.mean([b[i] for i in ids]))
        boots.append(diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(axis=1))
    if not means:
        return None
    pooled = np.mean(boots, axis=0)
    tail = (1 - level) / 2
    return MeanDelta(len(means), float(np.mean(bases)), float(np.mean(cands)), float(np.mean(means)),
                     float(np.quantile(pooled, tail)), float(np.quantile(pooled, 1 - tail)))


def verdict_counts(deltas: dict[str, DomainDelta], domains: list[str] | None = None) -> dict[str, int]:
    chosen = [deltas[d] for d in (domains if domains is not None else deltas) if d in deltas]
    return {v: sum(x.verdict == v for x in chosen) for v in VERDICTS}
