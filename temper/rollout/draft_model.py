"""The fast profile with a draft model: the prompt-lookup decoder's loop (``lookup.py``) with its draft tokens
from a small model instead of n-gram matches, and the draft models themselves.

Why the same loop: verification, cutting the rejected tail out of the cache, mixed batches, prefill by the
engine (prefix cache, chunked prefill, lanes) and the adaptive draft length are what make speculation exact
and cheap, and none of them depends on where the k draft tokens come from. (The profile this replaces called
transformers' assisted ``generate``, which cannot continue from the engine's KV cache: every turn re-encoded
prompt and completion on both models.)

The draft keeps a KV cache per request (growable layers, ``kv_cache.py``) and the tokens it holds. Before it
proposes, that cache is cut back to its common prefix with the request's sequence (a rejected draft, or the
target's own token after it, ends the prefix) and fed the rest: the prompt at the request's first draft, in
chunks of the smallest lane's ``prefill_chunk_tokens``; one or two emitted tokens at later steps. Then the
draft decodes its k tokens greedily.

Exactness: a greedy draft's tokens are a deterministic function of the sequence, so ``lookup.verify``'s rule
for a draft that puts all its mass on one token holds unchanged: greedy output is the target's, sampled output
is distributed as the target's, log-probabilities come from the target's verify forward. (Speculative sampling
with the draft's own distribution, accept with min(1, p/q), would accept more often; it is not built.)

Cost: the draft's decode forwards are timed as they run and added, per draft token, to what the draft's
verified positions cost (``draft_cost.py``), so a draft whose tokens cost more than they earn is not used: the
request then decodes as standard and probes with one draft token after each back-off, as lookup does; where not
even drafts certain to be accepted would pay (a draft nearly as slow as the target), it makes no probes either.
"""

from __future__ import annotations

import copy
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from temper.rollout.config import SpeculativeConfig
from temper.rollout.decoding import scaled_logits
from temper.rollout.kv_cache import cache_from, crop_cache
from temper.rollout.lookup import LookupDecoder
from temper.rollout.requests import DecoderHost, EngineRequest

FEED_LATENCY = 4  # a feed of at most this many tokens is timed as one draft step; a longer one is the draft's prefill


class DraftModelDecoder(LookupDecoder):
    """Speculative decoding with draft tokens from a small model on the engine's own decode loop."""

    def __init__(self, engine: DecoderHost, spec: SpeculativeConfig, draft=None) -> None:
        super().__init__(engine, spec)
        self.draft = draft if draft is not None else load_draft(spec, engine.model)
        self.draft.eval()
        self.chunk = min(lane.prefill_chunk_tokens for lane in engine.config.lanes)
        self.draft_step_s: float | None = None  # one draft decode forward, decayed mean
        self.stats["draft_forwards"] = 0

    def _draft_cost(self, k: int) -> float:
        """The verify positions' cost plus the k draft forwards that make the tokens, in tokens' worth of time."""
        verify = self.cost.draft_cost(k)
        if self.draft_step_s is None or k == 0:
            return verify
        return verify + k * self.draft_step_s * self.cost.tokens_per_s

    def _probe(self, req: EngineRequest, seq: list[int]) -> list[int]:
        return self._drafts(req, seq, 1)  # a draft model always has a guess

    @torch.no_grad()
    def _drafts(self, req: EngineRequest, seq: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        x = req.extra
        if "draft_cache" not in x:
            x["draft_cache"] = cache_from(None, self.draft.config, reserve=len(seq) + min(req.params.max_tokens, 512))
            x["draft_tokens"] = []
        cache, held = x["draft_cache"], x["draft_tokens"]
        keep = min(_common_prefix(held, seq), len(seq) - 1)  # the last token is always fed: its logits are needed
        if keep < len(held):
            crop_cache(cache, keep)
            del held[keep:]
        t0 = time.perf_counter()
        logits = self._feed(cache, seq[keep:], keep)
        if len(seq) - keep <= FEED_LATENCY:
            self._observe(time.perf_counter() - t0)
        held.extend(seq[keep:])
        drafts = [int(logits.argmax())]
        while len(drafts) < k:
            t0 = time.perf_counter()
            logits = self._feed(cache, drafts[-1:], len(held))
            self._observe(time.perf_counter() - t0)
            held.append(drafts[-1])
            drafts.append(int(logits.argmax()))
        return drafts

    def _feed(self, cache, tokens: list[int], start: int) -> torch.Tensor:
        """Append ``tokens`` (at positions from ``start``) to the draft's cache; the logits after the last one."""
        device = self.engine.device
        for lo in range(0, len(tokens), self.chunk):
            ids = tokens[lo:lo + self.chunk]
            pos = torch.arange(start + lo, start + lo + len(ids), device=device).unsqueeze(0)
            out = self.draft(input_ids=torch.tensor([ids], device=device), cache=cache, position_ids=pos,
                             use_cache=True, logits_to_keep=1)
            self.stats["draft_forwards"] += 1
        return out.logits[0, -1]

    def _observe(self, seconds: float) -> None:
        self.draft_step_s = seconds if self.draft_step_s is None else 0.9 * self.draft_step_s + 0.1 * seconds

    def _verify(self, logits: torch.Tensor, draft: list[int], req: EngineRequest):
        if self.spec.verify:
            return super()._verify(logits, draft, req)
        # lossy (verify: false): the draft's tokens as they are, then the target's greedy next one. Exists so the
        # parity gate is exercised against a real diverging variant; never served (the gate refuses it)
        tokens = [*draft, int(logits[len(draft)].argmax())]
        if not req.params.logprobs:
            return tokens, None, len(draft)
        scaled = scaled_logits(logits, req.params).log_softmax(dim=-1)
        return tokens, scaled[torch.arange(len(tokens)), torch.tensor(tokens)].tolist(), len(draft)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


def load_draft(spec: SpeculativeConfig, target):
    """The draft the config names: its folder (in the target's dtype), int8-quantized if asked; or an int8 copy
    of the target when no folder is given."""
    # lazy: transformers (800 ms) would load whenever temper.rollout.client is imported
    from transformers import AutoModelForCausalLM

    if spec.quantize_draft and target.device.type != "cpu":
        raise ValueError("quantize_draft makes an int8 CPU copy (torch's dynamic quantization); on a GPU give the "
                         "fast profile a draft_dir (a smaller model with the target's tokenizer)")
    draft = AutoModelForCausalLM.from_pretrained(spec.draft_dir, dtype=target.dtype).to(target.device) \
        if spec.draft_dir else target
    if spec.quantize_draft:
        draft = quantized_draft(draft)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft {spec.draft_dir} vocab {draft.config.vocab_size} != target "
                         f"{target.config.vocab_size}: a draft must share the target's tokenizer")
    return draft


def derive_layer_draft(target_dir: str | Path, out_dir: str | Path, keep_layers: int) -> Path:
    """Write a draft that is the target with only its first ``keep_layers`` decoder layers (tokenizer copied)."""
    # lazy: transformers (800 ms) would load whenever temper.rollout.client is imported
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir)
    total = model.config.num_hidden_layers
    if not 0 < keep_layers < total:
        raise ValueError(f"keep_layers must be in 1..{total - 1}, got {keep_layers}")
    model.model.layers = model.model.layers[:keep_layers]
    model.config.num_hidden_layers = keep_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:keep_layers]
    out = Path(out_dir)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out)
    return out


def quantized_draft(model):
    """An int8 dynamic-quantized copy of ``model`` (Linear layers), for use as an in-memory draft.

    Uses ``torch.ao.quantization.quantize_dynamic``, deprecated in favour of torchao but present in
    torch 2.13; CPU only.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval(), {torch.nn.Linear}, dtype=torch.qint8)
    return q
