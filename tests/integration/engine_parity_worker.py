"""``workloads.train`` on one rank with ``grpo.generation: engine``, checking log-prob parity as it goes.

After each rollout (sampled by the rank's embedded engine from its copy of the ZeRO-3 policy),
the rank recomputes the sampled tokens' log-probabilities with the trainer's own function on the
partitioned policy (``trainer.model``: every forward gathers the shards, the same collectives on
both ranks) and appends the largest gap per step to ``parity-rank<r>.jsonl``. The rewards are
replaced by a varied test reward (a random tiny model scores 0 on every real task, which would
leave the weights unchanged and the sync untested).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from temper.training import multiturn, rewards

_real_call = multiturn.MultiTurnRollout.__call__


def _pad(rows: list[list[int]], value: int, left: bool) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([[value] * (width - len(r)) + r if left else r + [value] * (width - len(r)) for r in rows])


def checked_call(self, prompts, trainer):
    result = _real_call(self, prompts, trainer)
    pad = trainer.processing_class.pad_token_id
    prompt_ids, completion_ids = result["prompt_ids"], result["completion_ids"]
    ids = torch.cat([_pad(prompt_ids, pad, True), _pad(completion_ids, pad, False)], dim=1)
    attention = torch.cat([_pad([[1] * len(p) for p in prompt_ids], 0, True),
                           _pad([[1] * len(c) for c in completion_ids], 0, False)], dim=1)
    mask = _pad(result["env_mask"], 0, False).float()
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, mask.size(1))
    sampled = _pad_float(result["logprobs"])
    gap = ((logps.float() - sampled).abs() * mask).max().item()
    out = Path(trainer.args.output_dir) / f"parity-rank{os.environ.get('RANK', '0')}.jsonl"
    with open(out, "a") as f:
        f.write(json.dumps({"step": trainer.state.global_step, "max_gap": gap, "tokens": int(mask.sum()),
                            "syncs": self.engine.syncs}) + "\n")
    return result


def _pad_float(rows: list[list[float]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32)


def varied(self, prompts, completions, **_):
    texts = [rewards.completion_text(c) for c in completions]
    return [sum(ch.isdigit() for ch in t) + 0.05 * len(t) for t in texts]


multiturn.MultiTurnRollout.__call__ = checked_call
rewards.DomainRewards.__call__ = varied

if __name__ == "__main__":
    from workloads.train import main

    sys.exit(main(sys.argv[1:]))
