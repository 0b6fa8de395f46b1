"""The standard profile's decoder: every sample of a request decodes as one batch of rows sharing the
prompt's KV (a GRPO group of G costs one prefill and ``max_tokens`` batched forwards). Its siblings are
``lookup.py`` and ``draft_model.py`` (speculative decoding). In mixed batches the engine runs the forward (``mixed.py``) and hands
each request's logits to ``advance``; ``step`` is the per-request path.
"""

from __future__ import annotations

import torch

from temper.rollout.decoding import next_tokens
from temper.rollout.kv_cache import kv_of
from temper.rollout.mixed import Segment
from temper.rollout.requests import DecoderHost, EngineRequest


class StandardDecoder:
    """All samples of a request decode together: one forward per step over ``len(active)`` rows."""

    needs_prefill = True
    mixes = True  # decode rows join the mixed forward (mixed.py)
    slot_decode = True  # ...or the slot pool's static forward (slots.py)
    supports_logprobs = True

    def __init__(self, engine: DecoderHost) -> None:
        self.engine = engine

    def observe(self, positions: int, rows: int, seconds: float, prefill: bool) -> None:
        """The engine's mixed forward just run and what it cost (the fast profile's draft lengths use it)."""

    def begin(self, req: EngineRequest, logits: torch.Tensor) -> None:
        n = req.params.n
        if n > 1:
            req.cache.batch_repeat_interleave(n)
        req.active = list(range(n))
        self._advance(req, *next_tokens(logits.expand(n, -1), req.params, req.generator))

    @torch.no_grad()
    def step(self, req: EngineRequest) -> None:
        e = self.engine
        rows = len(req.active)
        last = torch.tensor([[req.samples[i].token_ids[-1]] for i in req.active], device=e.device)
        pos = torch.full((rows, 1), req.cache.get_seq_length(), device=e.device)
        out = e.model(input_ids=last, cache=req.cache, position_ids=pos, use_cache=True)
        e._log(req, "decode", rows)
        self.advance(req, out.logits[:, -1])

    def segment(self, req: EngineRequest) -> Segment:
        """This step's rows for the engine's mixed forward: each active sample's last token."""
        return Segment(req.cache, [[req.samples[i].token_ids[-1]] for i in req.active], req.cache.get_seq_length())

    def advance(self, req: EngineRequest, logits: torch.Tensor) -> None:
        """Sample each active row's next token from ``logits`` [rows, vocab] (a decode forward's output)."""
        self._advance(req, *next_tokens(logits, req.params, req.generator))

    def _advance(self, req: EngineRequest, tokens: list[int], logprobs: list[float] | None) -> None:
        keep = []
        for row, (index, tok) in enumerate(zip(req.active, tokens)):
            self.engine.accept(req, index, [tok], None if logprobs is None else [logprobs[row]])
            if req.samples[index].finished:
                self.engine.cache_completion(req, index, kv_of(req.cache, row))
            else:
                keep.append(row)
        if len(keep) < len(req.active):
            if keep:
                req.cache.batch_select_indices(torch.tensor(keep, device=self.engine.device))
            req.active = [req.active[r] for r in keep]
