"""How fast a training step goes: its rollout and training phases, tokens, and model FLOPs utilisation.

A GRPO step is two phases: the rollout (TRL's ``_generate``: sampling every completion, through
TRL's generate, the rollout engine or a multi-turn ``rollout_func``) and the training phase (the
rewards, the policy's forward and backward, the optimizer step). They have different bounds: the
rollout is latency-bound decoding, the training phase is matrix work that should run near the
GPU's peak. So MFU is reported for the training phase alone:

    MFU = 6 * N * T / (t_train * peak * ranks)

N: the model's parameters (all of them, ZeRO-3 partitions counted whole); T: the tokens the step
trained on, summed over ranks (prompt + completion: TRL's ``num_tokens`` delta); 6 = 2 FLOPs per
parameter and token forward + 4 backward (attention's own FLOPs left out, as in the PaLM paper's
MFU without them); t_train: the step's wall time minus its rollout; peak: the device's dense bf16
peak (``temper.training.device.PEAK_BF16_FLOPS``). SFT has no rollout: t_train is the whole step.
"""

from __future__ import annotations

import functools
import time


class RolloutTimer:
    """Accumulates the wall time of a GRPO trainer's ``_generate`` (every rollout of a step)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, trainer) -> None:
        original = trainer._generate

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        trainer._generate = timed

    def take(self) -> float:
        """Seconds spent in rollouts since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def model_flops_utilization(params: int, tokens: float, seconds: float, peak_flops: float, ranks: int) -> float:
    """6·N·T / (t · peak · ranks): the share of the devices' peak the step's model FLOPs used."""
    if seconds <= 0 or peak_flops <= 0 or ranks <= 0:
        raise ValueError(f"MFU needs positive time, peak and ranks (got {seconds}, {peak_flops}, {ranks})")
    return 6.0 * params * tokens / (seconds * peak_flops * ranks)
