"""GRPO generation through the embedded rollout engine, with the policy's current weights.

``GRPOSettings.generation: engine`` makes every rollout of a GRPO run (single-turn groups and
multi-turn episodes alike, both through ``temper.training.multiturn.MultiTurnRollout``, TRL's
``rollout_func``) sample from a ``temper.rollout.engine.Engine`` in the rank's own process: one
request per group of identical contexts (a GRPO group's first turn: one prefill of the prompt,
the G samples decoded as one batch), later turns of an episode reuse its history's KV from the
prefix cache, long prompts are prefilled in chunks.

Why this is on-policy. With TRL 1.16's defaults (``num_iterations=1``, one generation per
optimizer step) GRPO's loss takes the sampling policy to *be* the policy it updates: the "old"
log-probabilities are the current model's own (``old_per_token_logps = per_token_logps.detach()``),
the importance ratio is exactly 1 and the update is the on-policy policy gradient. That is true
only if the tokens really were sampled from the weights being updated. The engine holds its own
copy of the model, so ``PolicyEngine.ensure_current`` copies the policy's parameters into it
whenever the trainer's ``global_step`` has moved since the last copy, i.e. after every optimizer
step and before that step's first token is sampled (and after a resume), and empties the engine's
prefix KV cache, whose keys and values the old weights computed. Every token of step s is thus
drawn from the step-s weights, and the engine's log-probability of each sampled token equals the
trainer's recomputation (``tests/integration/test_engine_rollouts.py`` checks it to 1e-4 nats per
token in fp32 at every step, and that it fails without the sync). The engine returns those
log-probabilities to TRL as the rollout's ``logprobs``.

Under DeepSpeed ZeRO-3 each rank holds a shard of every parameter: the sync gathers the full
parameters in chunks of at most ``gather_bytes`` with ``deepspeed.zero.GatheredParameters`` (a
collective: every rank syncs at the same step, walking the parameters in the same order), each
rank copies them into its own engine model, and the shards are released at the end of each chunk.
Generation itself is then local to the rank (no collective), so ranks whose episodes take
different numbers of turns never wait on each other.

Device and precision: the engine's copy lives on the rank's own device (``cuda:LOCAL_RANK`` on a
GPU rank, so the weight sync is a device-to-device copy) and samples in the precision the policy
computes in: fp32 on CPU; bf16 when the run's precision is bf16 (DeepSpeed's bf16 parameters, or
the Trainer's bf16 autocast over fp32 weights). bf16 log-probabilities differ from fp32 ones by
~1e-3 nats per token: parity to 1e-4 is a property of fp32 training.

Cost: one more full copy of the weights per rank, plus the engine's KV cache; the sync is one
read of every parameter per step (ZeRO-3: one all-gather of each).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from temper.rollout.config import EngineConfig, LaneConfig, PrefixCacheConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine, Finished

log = logging.getLogger(__name__)

GATHER_BYTES = 256 * 1024 * 1024


class EngineUnsupported(ValueError):
    """A GRPO setting the engine cannot sample with (it would sample from another distribution)."""


def _numel(p: torch.Tensor) -> int:
    return int(getattr(p, "ds_numel", p.numel()))


@contextmanager
def gathered(params: list[torch.Tensor]) -> Iterator[None]:
    """The full tensors of ``params`` for the duration (ZeRO-3 shards gathered on every rank, read-only)."""
    if any(hasattr(p, "ds_id") for p in params):
        # lazy: deepspeed (1.5 s) is only needed when the policy is ZeRO-3 partitioned
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield
    else:
        yield


class PolicyEngine:
    """An ``Engine`` over a copy of a GRPO trainer's policy, kept equal to it step by step."""

    def __init__(self, trainer, gather_bytes: int = GATHER_BYTES, prefix_cache_bytes: int = 256 * 1024 * 1024,
                 sync: bool = True) -> None:
        self.trainer, self.gather_bytes, self.sync_enabled = trainer, gather_bytes, sync
        args = trainer.args
        if (args.top_k or 0) > 0 or args.min_p is not None or args.repetition_penalty != 1.0:
            raise EngineUnsupported("grpo.generation 'engine' samples with temperature and top_p only; "
                                    f"top_k={args.top_k}, min_p={args.min_p}, "
                                    f"repetition_penalty={args.repetition_penalty} are not supported")
        policy = trainer.model
        self.dtype = torch.bfloat16 if args.bf16 else next(policy.parameters()).dtype
        # a plain (unpartitioned) module of the policy's class on the rank's device: built outside any
        # zero.Init context, so each rank holds the full tensors; its values come from the first sync
        config = copy.deepcopy(policy.config)
        with torch.device(trainer.accelerator.device):  # initialised where it runs (a 0.7B CPU init takes ~15 s)
            model = type(policy)(config).to(self.dtype)
        model.generation_config = copy.deepcopy(policy.generation_config)
        model.requires_grad_(False).eval()
        tokenizer = trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        context = int(config.max_position_embeddings)
        lane = LaneConfig(name="grpo", max_prompt_tokens=context, max_queued=100_000, max_running=4096,
                          prefill_chunk_tokens=512)
        self.engine = Engine(EngineConfig(model_dir=Path(getattr(config, "_name_or_path", "") or "."),
                                          lanes=[lane], prefix_cache=PrefixCacheConfig(budget_bytes=prefix_cache_bytes),
                                          # no latency to protect here: a forward takes every group's decode rows
                                          # and up to the lane's 512 prompt tokens
                                          forward_token_budget=1 << 16,
                                          step_log_size=0),
                             model=model, tokenizer=tokenizer)
        self.model = model
        self.synced_step: int | None = None
        self.syncs = 0
        self.sync_s = 0.0

    # -- weights --------------------------------------------------------------------------------------
    def ensure_current(self) -> None:
        """Copy the policy's weights in if an optimizer step happened since the last copy (every rank
        calls this at the same points: the start of each rollout)."""
        step = self.trainer.state.global_step
        if self.synced_step == step:
            return
        if self.synced_step is None or self.sync_enabled:
            self.sync()
        self.synced_step = step

    @torch.no_grad()
    def sync(self) -> None:
        """The policy's parameters into the engine's model (ZeRO-3: gathered chunk by chunk), and the
        engine's prefix KV dropped (computed by the old weights)."""
        t0 = time.perf_counter()
        src = dict(self.trainer.model.named_parameters())
        dst = dict(self.model.named_parameters())
        if set(src) != set(dst):
            raise RuntimeError(f"engine model and policy differ in parameters: {sorted(set(src) ^ set(dst))[:5]}")
        names = list(src)  # the policy's own order: the same on every rank, so the gathers pair up
        chunk: list[str] = []
        size = 0
        for i, name in enumerate(names):
            chunk.append(name)
            size += _numel(src[name]) * src[name].element_size()
            if size >= self.gather_bytes or i == len(names) - 1:
                with gathered([src[n] for n in chunk]):
                    for n in chunk:
                        dst[n].copy_(src[n].data.reshape(dst[n].shape))
                chunk, size = [], 0
        if self.engine.prefix_cache is not None:
            self.engine.prefix_cache.clear()
        self.syncs += 1
        self.sync_s += time.perf_counter() - t0

    # -- sampling -------------------------------------------------------------------------------------
    def sample(self, requests: list[tuple[list[int], int, int]]) -> list[list[tuple[list[int], list[float]]]]:
        """For each (context token ids, n, max new tokens): n sampled continuations, each as (token ids
        ending at the first EOS, the log-probability of each under the sampling distribution)."""
        t = self.trainer
        params = [SamplingParams(max_tokens=max_new, temperature=t.temperature, top_p=t.top_p or 1.0, n=n,
                                 logprobs=True) for _, n, max_new in requests]
        errors: list[str] = []

        def sink(ev: Any) -> None:
            if isinstance(ev, Finished) and ev.error:
                errors.append(ev.error)

        reqs = [self.engine.submit([list(ids)], p, [sink])[0] for (ids, _, _), p in zip(requests, params)]
        self.engine.run_until_idle()
        if errors:
            raise RuntimeError(f"rollout engine: {len(errors)} request(s) failed: {errors[0]}")
        return [[(list(s.token_ids), list(s.logprobs)) for s in req.samples] for req in reqs]

    def stats(self) -> dict[str, Any]:
        return {"syncs": self.syncs, "sync_s": self.sync_s, **self.engine.stats()}
