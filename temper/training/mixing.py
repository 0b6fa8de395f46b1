"""Seeded domain-mixing sampler: which (domain, record) fills each slot of the RL stream.

Each slot draws a domain with probability proportional to its ``sampling_ratio``; within a
domain, records are visited in a seeded permutation, reshuffled each time the domain's
records run out (a per-domain epoch), so no record repeats before all were seen. The whole
state is a few integers plus the RNG state, saved in every checkpoint: resuming continues
the exact same order, and a resume over different data is detected (see ``state_dict``).
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
    _rng: random.Random = field(init=False, repr=False)
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
        self._rng = random.Random(f"mix:{self.seed}")
        self._perm, self._cursor, self._epoch = {}, {}, {}
        for n in self.names:
            self._epoch[n] = -1
            self._new_epoch(n)

    def _new_epoch(self, name: str) -> None:
        self._epoch[name] += 1
        perm = list(range(self.sizes[name]))
        random.Random(f"perm:{self.seed}:{name}:{self._epoch[name]}").shuffle(perm)
        self._perm[name], self._cursor[name] = perm, 0

    def next(self) -> tuple[str, int]:
        name = self._rng.choices(self.names, weights=self.weights)[0]
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
                "rng": _rng_to_json(self._rng.getstate())}

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
        self._rng.setstate(_rng_from_json(state["rng"]))


def _rng_to_json(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_from_json(state: list) -> tuple:
    return (state[0], tuple(state[1]), state[2])
