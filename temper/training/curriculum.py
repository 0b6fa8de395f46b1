"""Online GRPO curriculum: sampling weights that follow each domain's recent rewards, replayable.

A GRPO group whose completions all get the same reward has zero advantage and teaches nothing. At
hundreds of domains, many are solved or hopeless for the current model, so ``Curriculum`` moves
sampling weight toward domains that are neither (the formula and defaults: ``CurriculumSettings``).
It tracks each domain's recent pass rate, but weighs by the recent fraction of its groups that had
signal: the pass rate is only a proxy for that. A domain whose prompts are each either always or
never solved has a mid pass rate and no signal (a tiny model at low temperature does exactly this),
and partial-credit rewards give signal at any pass rate.

Deciding online breaks the old design, where the whole stream was materialised before step 1.
``CurriculumStream`` decides each batch's slots when the data loader first asks for them, from
the stratified ``DomainMixSampler`` reweighted by the curriculum. Exactness rests on three rules:

* The inputs are integers gathered from every rank: per step and domain, (completions scored,
  passed, groups, groups with signal). Every rank observes the same list, so every rank draws the
  same stream (and the ranks compare a hash of it every step).
* Batch ``b`` is drawn from the observations of batches ``<= b - LAG`` only. The loader fetches
  one batch ahead (accelerate's ``DataLoaderShard``), so when batch ``b`` is fetched, step ``b - 1``
  is still to run and ``b - 2`` is the newest finished one: with ``LAG = 2`` the draw never depends
  on timing. A draw that would need an observation not yet made raises instead of guessing.
* The observation log is the whole input, so it is the checkpointed state: a resumed run replays
  it from a fresh sampler to the checkpoint's step (and checks the replay against the saved
  snapshot of counts, targets, rate estimates, weights and stream hash), then continues. There is no
  other randomness: ties and record orders come from the seed, as in the fixed mix.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from temper.training.config import CurriculumSettings, TrainingError
from temper.training.mixing import DomainMixSampler

LAG = 2  # batches between the newest observation a draw may use and the batch drawn (see above)
# Priors, one pseudo-observation each that decays like real ones (so a long all-pass run reaches 1):
PRIOR_PASS_RATE = 0.5
PRIOR_SIGNAL = 1.0  # an unseen domain is assumed to give signal, so it gets tried before judged


class Curriculum:
    """Per-domain decayed counts (completions, passes, groups, groups with signal) and the
    multipliers they imply (pure, deterministic)."""

    def __init__(self, names: list[str], settings: CurriculumSettings) -> None:
        self.names, self.settings = sorted(names), settings
        self.seen = dict.fromkeys(self.names, 1.0)
        self.passed = dict.fromkeys(self.names, PRIOR_PASS_RATE)
        self.groups = dict.fromkeys(self.names, 1.0)
        self.signal = dict.fromkeys(self.names, PRIOR_SIGNAL)

    def observe(self, totals: dict[str, list[int]]) -> None:
        """One step's [scored, passed, groups, groups with signal] per domain; a domain's older counts
        decay by ``1 - 1/window`` each time it is seen, so its rates are over its last ~window steps."""
        keep = 1.0 - 1.0 / self.settings.window
        for name in sorted(totals):
            scored, passed, groups, signal = totals[name]
            if name not in self.seen:
                continue
            if scored > 0:
                self.seen[name] = keep * self.seen[name] + scored
                self.passed[name] = keep * self.passed[name] + passed
            if groups > 0:
                self.groups[name] = keep * self.groups[name] + groups
                self.signal[name] = keep * self.signal[name] + signal

    def pass_rate(self, name: str) -> float:
        return self.passed[name] / self.seen[name]

    def signal_rate(self, name: str) -> float:
        """Recent fraction of the domain's groups whose rewards were not all equal."""
        return self.signal[name] / self.groups[name]

    def multipliers(self) -> dict[str, float]:
        """In [min_multiplier, 1]: the floor for a domain none of whose recent groups had signal."""
        floor = self.settings.min_multiplier
        return {n: floor + (1.0 - floor) * self.signal_rate(n) for n in self.names}

    def state_dict(self) -> dict[str, Any]:
        return {"seen": dict(self.seen), "passed": dict(self.passed), "groups": dict(self.groups),
                "signal": dict(self.signal)}


class CurriculumStream:
    """The GRPO prompt stream, drawn batch by batch from the curriculum-weighted sampler.

    ``observations[b]`` holds step ``b + 1``'s ``{domain: [scored, passed, groups, signal]}`` (all ranks).
    """

    def __init__(self, sampler: DomainMixSampler, settings: CurriculumSettings,
                 prompts_per_step: int, observations: list[dict[str, list[int]]] | None = None) -> None:
        self.sampler, self.prompts_per_step = sampler, prompts_per_step
        self.base = {n: sampler.ratios[n] for n in sampler.names}
        self.curriculum = Curriculum(sampler.names, settings)
        self.observations: list[dict[str, list[int]]] = [dict(o) for o in observations or []]
        self.applied = 0  # observations folded into the curriculum so far
        self.slots: list[tuple[str, int]] = []
        self.batch_weights: dict[int, dict[str, float]] = {}
        self.digests: list[str] = []  # digests[b]: hash chain of batches 0..b (slots and weights)

    # -- inputs ----------------------------------------------------------------------------
    def observe(self, batch: int, totals: dict[str, list[int]]) -> None:
        """Record step ``batch + 1``'s gathered counts; the log must grow one batch at a time."""
        clean = {n: [int(x) for x in v] for n, v in sorted(totals.items())}
        if batch < len(self.observations):
            if self.observations[batch] != clean:
                raise TrainingError(f"curriculum: batch {batch} observed twice with different counts")
            return
        if batch != len(self.observations):
            raise TrainingError(f"curriculum: batch {batch} observed, but batches {len(self.observations)}.."
                                f"{batch - 1} were not (the observation log must have no gap)")
        self.observations.append(clean)

    # -- drawing ---------------------------------------------------------------------------
    def _draw_batch(self) -> None:
        batch = len(self.slots) // self.prompts_per_step
        newest = batch - LAG
        if newest >= len(self.observations):
            raise TrainingError(f"curriculum: batch {batch} needs the rewards of step {newest + 1}, not observed "
                                "yet (the data loader ran more than one batch ahead)")
        while self.applied <= newest:
            self.curriculum.observe(self.observations[self.applied])
            self.applied += 1
        multipliers = self.curriculum.multipliers()
        self.sampler.reweight({n: self.base[n] * multipliers[n] for n in self.base})
        self.batch_weights[batch] = self.sampler.current_weights()
        drawn = self.sampler.take(self.prompts_per_step)
        self.slots += drawn
        previous = self.digests[-1] if self.digests else ""
        self.digests.append(hashlib.sha256(json.dumps([previous, drawn, self.batch_weights[batch]]).encode())
                            .hexdigest())

    def slot(self, index: int) -> tuple[str, int]:
        """(domain, record index) of stream slot ``index`` (drawing up to it if needed)."""
        while len(self.slots) <= index:
            self._draw_batch()
        return self.slots[index]

    def advance_to(self, step: int) -> "CurriculumStream":
        """Draw the batches of steps 1..``step`` (a replay to a checkpoint)."""
        if step > 0:
            self.slot(step * self.prompts_per_step - 1)
        return self

    def digest(self, batch: int) -> str:
        """Hash of every slot and weight of batches 0..``batch``: ranks (and runs) compare streams by it."""
        self.slot((batch + 1) * self.prompts_per_step - 1)
        return self.digests[batch]

    def weights(self, batch: int) -> dict[str, float] | None:
        """The sampling weights batch ``batch`` (step ``batch + 1``) was drawn with."""
        return self.batch_weights.get(batch)

    # -- checkpoint ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The observation log (the input) plus a snapshot of what it produced (for the resume check)."""
        return {"observations": [dict(o) for o in self.observations], "applied": self.applied,
                "digest": self.digests[-1] if self.digests else "", "batches": len(self.digests),
                "sampler": self.sampler.state_dict(), "curriculum": self.curriculum.state_dict()}


def replay(sampler: DomainMixSampler, settings: CurriculumSettings, prompts_per_step: int,
           observations: list[dict[str, list[int]]], step: int) -> CurriculumStream:
    """The stream as it stood after ``step`` steps, given the first ``step`` observations."""
    if len(observations) < step:
        raise TrainingError(f"curriculum: a checkpoint at step {step} holds only {len(observations)} observations")
    stream = CurriculumStream(sampler, settings, prompts_per_step, observations[:step])
    return stream.advance_to(step)


def lazy_dataset(stream: CurriculumStream, num_slots: int, row: Any):
    """A ``datasets.Dataset`` of ``num_slots`` rows whose content is decided when the loader reads it.

    TRL's GRPOTrainer takes only ``datasets`` datasets and indexes them through its RepeatSampler,
    so the table holds the slot numbers and an on-the-fly transform asks the stream for each
    slot's (domain, record) and renders it with ``row(name, index) -> dict``. Rows keep their
    ``slot``: TRL hands it to the reward function, which groups completions by it.
    """
    # lazy: datasets (1.3 s) would load in the fast unit tests of the sampler (test_curriculum.py)
    import datasets

    def transform(batch: dict[str, list]) -> dict[str, list]:
        rows = [{**row(*stream.slot(i)), "slot": i} for i in batch["slot"]]
        return {key: [r[key] for r in rows] for key in rows[0]} if rows else {}

    return datasets.Dataset.from_dict({"slot": list(range(num_slots))}).with_transform(transform)
