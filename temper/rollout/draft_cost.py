"""How many draft tokens a prompt-lookup step should verify, from what a verified position costs on this machine.

Why a cost model and not a fixed rule: a draft token rides in the target's forward as one more position.
On a GPU at small batch that is nearly free; on a CPU it is not (SmolLM2-135M on 2 cores: a 1-token forward
34 ms, 2 tokens 38.5, 5 tokens 54, 9 tokens 67), and in a batch of 8 one request's extra positions slow all 8
rows. A draft token pays only when the tokens it is expected to add are worth more than the time it adds, so
the same acceptance rate can be worth drafting at batch 1 and not at batch 8, or on one machine and not on
another. Both sides are measured as the engine runs:

- ``ForwardCost``: the engine's decode forwards (prefill chunks aside: their positions cost differently)
  as seconds against positions, a least-squares line with recent forwards weighing more; its slope is
  what one more position costs. ``position_value`` puts that in tokens: slope x the tokens per second the
  forwards emit, i.e. the share of a token's worth of time one more position takes.
- per request, two chances, decayed so a request that starts or stops copying is noticed: ``first``, that
  a draft's first token is accepted, and ``then``, that a token after an accepted one is. Copying comes in
  runs: a lookup whose first token is right is usually inside a copied span, so ``then`` is much higher
  than ``first`` (one rate for both would cut drafts short exactly where they pay).

The i-th draft token adds first x then^(i-1) expected tokens for one position, so ``draft_length`` proposes
the largest k whose k-th token is still worth more than the position (none when the first is not).
Greedy and sampled outputs do not depend on k (``lookup.verify`` keeps the target's distribution for any
draft), only the speed does.
"""

from __future__ import annotations

import math


class ForwardCost:
    """A forward's seconds as ``a + b * positions`` over recent decode forwards; the tokens they emit per second."""

    def __init__(self, decay: float = 0.97, warmup: int = 8) -> None:
        self.decay, self.warmup = decay, warmup
        self.n = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.tokens_per_s = 0.0

    def observe(self, positions: int, tokens: int, seconds: float) -> None:
        """One decode forward: ``positions`` new positions (rows and drafts), ``tokens`` rows it emits for."""
        if seconds <= 0:
            return
        d = self.decay
        self._w, self._x, self._y = d * self._w + 1, d * self._x + positions, d * self._y + seconds
        self._xx, self._xy = d * self._xx + positions * positions, d * self._xy + positions * seconds
        rate = tokens / seconds
        self.tokens_per_s = rate if self.n == 0 else 0.9 * self.tokens_per_s + 0.1 * rate
        self.n += 1

    def per_position(self) -> float | None:
        """Seconds one more position adds (the line's slope, never below 0); None until the forwards seen
        differ in positions (a slope needs two sizes) and ``warmup`` of them were seen."""
        if self.n < self.warmup:
            return None
        mean_x = self._x / self._w
        var = self._xx / self._w - mean_x * mean_x
        if var < 0.25:  # nearly every forward had the same size
            return None
        cov = self._xy / self._w - mean_x * self._y / self._w
        return max(0.0, cov / var)

    def position_value(self) -> float | None:
        """What one more position costs, in emitted tokens' worth of time; None while unknown."""
        slope = self.per_position()
        return None if slope is None else slope * self.tokens_per_s


class Acceptance:
    """A request's draft record: how often a draft's first token is accepted, and a token after an accepted
    one; counts decay by ``decay`` a step, with one accept and one reject as the prior (a fresh request: 1/2)."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.first_ok = self.first_no = self.then_ok = self.then_no = 0.0

    def update(self, proposed: int, accepted: int) -> None:
        d = self.decay
        self.first_ok, self.first_no = d * self.first_ok + (accepted > 0), d * self.first_no + (accepted == 0)
        if accepted and proposed > 1:  # only a step past its first token says anything about the run rate
            self.then_ok = d * self.then_ok + accepted - 1
            self.then_no = d * self.then_no + (accepted < proposed)

    @property
    def first(self) -> float:
        return (self.first_ok + 1) / (self.first_ok + self.first_no + 2)

    @property
    def then(self) -> float:
        return (self.then_ok + 1) / (self.then_ok + self.then_no + 2)


def draft_length(first: float, then: float, value: float, k_max: int) -> int:
    """The largest k <= ``k_max`` whose k-th draft token is still expected to pay: first x then^(k-1) > ``value``."""
    if k_max <= 0 or first <= value:
        return 0
    if value <= 0 or then >= 1:
        return k_max
    if then <= 0:
        return 1
    more = math.ceil(math.log(value / first) / math.log(then)) - 1  # tokens after the first that still pay
    return max(1, min(k_max, 1 + more))
