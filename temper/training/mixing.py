"""Seeded, stratified domain-mixing sampler: which (domain, record) fills each slot of the RL stream.

Domains are not drawn independently: with hundreds of domains, independent draws leave some
domains far below their share (and some unseen) over a short run. Instead every slot goes to
the domain whose quota is most overdue, Tijdeman's rule for the "chairman assignment" problem:
among domains whose count is below ``(n + 1) * weight``, take the one with the earliest deadline
``(count + 1) / weight``. For every prefix of ``n`` slots each domain's count then stays within 1
of ``n * weight`` (Tijdeman 1980 proves ``1 - 1/(2k - 2)`` for k domains); ties (equal weights)
are broken by a seeded permutation of the domains, so which domains come first is seeded too.

Weights may change online (``reweight``, used by the curriculum): the cumulative target of a
domain is then piecewise linear, ``target(n) = anchor_target + (n - anchor) * weight``, and the same
rule runs on it (due: count below target(n + 1); earliest deadline: when target reaches count + 1
at the current weight). Never reweighted, the anchor is (0, 0) and every float is the one the
fixed rule computes, so the stream is exactly the fixed one.

Within a domain, records are visited in a seeded permutation, reshuffled each time the domain's
records run out (a per-domain epoch), so no record repeats before all were seen. The whole
state is a few integers per domain, saved in every checkpoint: resuming continues the exact
same order, and a resume over different data is detected (see ``state_dict``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class DomainMixSampler:
    sizes: dict[str, int]
    ratios: dict[str, float]
    seed: int = 0
    position: int = 0
    _perm: dict[str, list[int]] = field(init=False, repr=False)
    _cursor: dict[str, int] = field(init=False, repr=False)
    _epoch: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        bad = [d for d in self.ratios if self.sizes.get(d, 0) <= 0]
        if bad:
            raise ValueError(f"domains with no training records: {', '.join(bad)}")
        self.names = sorted(self.ratios)
        total = sum(self.ratios[n] for n in self.names)
        self.weights = [self.ratios[n] / total for n in self.names]
        order = list(range(len(self.names)))
        random.Random(f"mix:{self.seed}").shuffle(order)
        self._tiebreak = {self.names[i]: rank for rank, i in enumerate(order)}
        self._count = dict.fromkeys(self.names, 0)
        self._anchor, self._anchor_target = 0, dict.fromkeys(self.names, 0.0)
        self._reweighted = False
        self._perm, self._cursor, self._epoch = {}, {}, {}
        for n in self.names:
            self._epoch[n] = -1
            self._new_epoch(n)

    def _new_epoch(self, name: str) -> None:
        self._epoch[name] += 1
        perm = list(range(self.sizes[name]))
        random.Random(f"perm:{self.seed}:{name}:{self._epoch[name]}").shuffle(perm)
        self._perm[name], self._cursor[name] = perm, 0

    def _pick(self) -> str:
        n, a, base = self.position + 1, self._anchor, self._anchor_target
        due = [(name, w) for name, w in zip(self.names, self.weights)
               if base[name] + (n - a) * w - self._count[name] > 1e-12]
        return min(due, key=lambda nw: (a + (self._count[nw[0]] + 1 - base[nw[0]]) / nw[1],
                                        self._tiebreak[nw[0]]))[0]

    def targets(self) -> dict[str, float]:
        """Each domain's cumulative target share of the slots given so far (sum = position)."""
        steps = self.position - self._anchor
        return {n: self._anchor_target[n] + steps * w for n, w in zip(self.names, self.weights)}

    def reweight(self, ratios: dict[str, float]) -> None:
        """From the next slot on, mix by ``ratios`` (normalised; every run domain, each > 0).

        The slots already given keep the targets they had, so counts track the cumulative target.
        """
        if sorted(ratios) != self.names or any(r <= 0 for r in ratios.values()):
            raise ValueError(f"reweight needs a ratio > 0 for exactly the domains {self.names}")
        total = sum(ratios[n] for n in self.names)
        weights = [ratios[n] / total for n in self.names]
        if weights == self.weights:
            return
        self._anchor_target, self._anchor = self.targets(), self.position
        self.weights, self._reweighted = weights, True

    def current_weights(self) -> dict[str, float]:
        return dict(zip(self.names, self.weights))

    def next(self) -> tuple[str, int]:
        name = self._pick()
        self._count[name] += 1
        if self._cursor[name] >= len(self._perm[name]):
            self._new_epoch(name)
        idx = self._perm[name][self._cursor[name]]
        self._cursor[name] += 1
        self.position += 1
        return name, idx

    def take(self, n: int) -> list[tuple[str, int]]:
        return [self.next() for _ in range(n)]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "position": self.position, "sizes": dict(self.sizes),
                "ratios": dict(self.ratios), "cursor": dict(self._cursor), "epoch": dict(self._epoch),
                "count": dict(self._count),
                **({"anchor": {"position": self._anchor, "targets": dict(self._anchor_target),
                               "weights": self.current_weights()}} if self._reweighted else {})}

    def load_state_dict(self, state: dict) -> None:
        if state["sizes"] != self.sizes or state["ratios"] != self.ratios or state["seed"] != self.seed:
            raise ValueError(f"sampler state is for sizes={state['sizes']} ratios={state['ratios']} "
                             f"seed={state['seed']}, this run has sizes={self.sizes} ratios={self.ratios} seed={self.seed}")
        self.position = state["position"]
        self._epoch = dict(state["epoch"])
        for n in self.names:
            perm = list(range(self.sizes[n]))
            random.Random(f"perm:{self.seed}:{n}:{self._epoch[n]}").shuffle(perm)
            self._perm[n] = perm
        self._cursor = dict(state["cursor"])
        self._count = dict(state["count"])
        if "anchor" in state:
            self._anchor, self._anchor_target = state["anchor"]["position"], dict(state["anchor"]["targets"])
            self.weights = [state["anchor"]["weights"][n] for n in self.names]
            self._reweighted = True

    def counts(self) -> dict[str, int]:
        """Slots given to each domain so far."""
        return dict(self._count)
