"""How many draft tokens a prompt-lookup step should verify, from what a verified position costs on this machine.

Why a cost model and not a fixed rule: a draft token rides in the target's forward as one more position,
and what that costs depends on the machine and the batch. Measured on this 2-core CPU with SmolLM2-135M
(one forward over a 300-token cache): 1 new position 70 ms, 2: 110, 3: 128, 5: 103, 9: 118, 17: 140. The
first draft token is the expensive one (a forward of one position per row runs matrix-vector kernels;
two or more run matrix-matrix ones), every later one is cheap; in a batch of 8 rows the forward is
already a matrix-matrix one, so drafts only add their few positions. A rule that ignores this drafts one
token where drafting at all costs half a forward, and too few where it pays. Both sides are measured as
the engine runs:

- ``ForwardCost``: the engine's decode forwards (prefill chunks aside) as seconds = a + b x positions +
  c x [more than one position], a least-squares fit with recent forwards weighing more: ``c`` is
  what verifying at all costs, ``b`` each position. With the tokens the forwards emit per second, both
  are put in tokens' worth of time.
- per request, two chances, decayed so a request that starts or stops copying is noticed: ``first``, that
  a draft's first token is accepted, and ``then``, that a token after an accepted one is. Copying comes in
  runs: a lookup whose first token is right is usually inside a copied span, so ``then`` is much higher
  than ``first`` (one rate for both would cut drafts short exactly where they pay).

A draft of k tokens adds first x (1 + then + .. + then^(k-1)) expected tokens; ``draft_length`` proposes
the k with the most expected tokens over what its positions cost (none when no k gains), so a request
that copies long runs drafts long and one that rarely copies does not draft. Greedy and sampled outputs
do not depend on k (``lookup.verify`` keeps the target's distribution for any draft), only the speed does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class ForwardCost:
    """A decode forward's seconds as ``a + b * positions + c * [more than one position]`` over recent
    forwards, and the tokens they emit per second."""

    def __init__(self, decay: float = 0.97, warmup: int = 8) -> None:
        self.decay, self.warmup = decay, warmup
        self.n = 0
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self.tokens_per_s = 0.0
        self.rows = 1  # decode rows of the latest forward
        self._fitted: tuple[float, float] | None = None

    def observe(self, positions: int, rows: int, seconds: float) -> None:
        """One decode forward: ``positions`` new positions (rows and drafts) over ``rows`` rows."""
        if seconds <= 0 or rows <= 0:
            return
        x = np.array([1.0, positions, float(positions > 1)])
        self._xtx = self.decay * self._xtx + np.outer(x, x)
        self._xty = self.decay * self._xty + x * seconds
        rate = rows / seconds
        self.tokens_per_s = rate if self.n == 0 else 0.9 * self.tokens_per_s + 0.1 * rate
        self.rows = rows
        self.n += 1
        if self.n >= self.warmup:  # solved here, once a forward, not per request and k (a solve is ~20 us, a
            ridge = 1e-6 * max(1.0, float(np.trace(self._xtx)))  # tiny model's whole step ~2 ms)
            _, b, c = np.linalg.solve(self._xtx + ridge * np.eye(3), self._xty)
            self._fitted = max(0.0, float(b)), max(0.0, float(c))

    def fit(self) -> tuple[float, float] | None:
        """(seconds per position, seconds for verifying at all), neither below 0; None until ``warmup``
        forwards were seen. A term the forwards never varied (no drafts yet) is held at 0 by a small ridge."""
        return self._fitted

    def draft_cost(self, k: int) -> float | None:
        """What ``k`` draft tokens of one request add to the next forward, in emitted tokens' worth of time:
        k positions, and the verify step's own cost when the forward would otherwise be one position per row
        (the latest forward's rows are the estimate of the next one's)."""
        fitted = self.fit()
        if fitted is None:
            return None
        per_position, verify = fitted
        if k == 0:
            return 0.0
        alone = self.rows == 1  # a one-row forward: the drafts turn it into a matrix-matrix one
        return (per_position * k + (verify if alone else 0.0)) * self.tokens_per_s


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


def draft_length(first: float, then: float, cost: Callable[[int], float], k_max: int) -> int:
    """The k <= ``k_max`` with the most expected tokens over their cost (``cost(k)``, in tokens); 0 when none
    gains. A draft of k adds first x (1 + then + .. + then^(k-1)) expected tokens."""
    best_k, best, expected = 0, 0.0, 0.0
    for k in range(1, k_max + 1):
        expected += first * then ** (k - 1)
        if expected - cost(k) > best:
            best_k, best = k, expected - cost(k)
    return best_k
