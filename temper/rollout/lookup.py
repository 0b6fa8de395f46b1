"""The fast profile's prompt-lookup decoder: speculative decoding inside the engine's own decode loop, on its
KV cache, with no second model.

A step of a request with one active sample proposes up to ``k`` tokens by n-gram lookup (the tokens that
followed the latest earlier occurrence of the sequence's last 3, 2 or 1 tokens, in the prompt or in the
text generated so far), runs ONE forward of the target over ``[last token, *drafts]`` on the request's
cache, keeps the accepted prefix plus the target's own next token, and crops the rejected tail out of the
cache. Copy-heavy work (extraction, document questions, code repair, tool histories) repeats spans of its
input, so one forward often yields several tokens.

Exactness. Greedy: every token is the target's argmax at its position, so the output is the standard
profile's (up to the float rounding of a k+1-token forward versus a 1-token one, which the tests check on
the catalog's families). Sampling: the standard speculative rejection rule for a draft that puts all its
mass on one token x: accept x with probability p(x), else draw from p with x removed (renormalized), and
draw the bonus token from p; every emitted token is then distributed as the target's (``verify``).
Log-probabilities come from the verify forward's logits, as the standard profile's from its own.

What it shares with the standard profile: admission, lanes, chunked prefill and the prefix cache (prefill
is the engine's, ``needs_prefill``), the first token, stop handling, and mixed batches: a request's verify
rides in the one forward of every running request as a segment of 1 + k tokens (``mixed.py``), so 8
requests cost one forward, not 8 (the scheduler's token budget counts their decode rows, not the drafts).
Requests with ``n > 1`` rows (a GRPO group) decode as the standard profile does: the rows would accept
different lengths but share one cache length.

How many drafts (``draft_cost.py``): a verified position costs compute, which on a CPU, and at batch 8
anywhere, is not free. The decoder measures what one more position costs in the engine's forwards and, per
request, how often a draft token is accepted, and proposes only the draft tokens expected to pay (none
when they do not: then it skips drafting for 1, 2, 4 .. 16 steps and probes with one token, where the text
repeats its last ``max_ngram`` tokens, so a request whose drafts fail decodes almost as standard). Until
enough forwards are measured, the first step proposes ``num_assistant_tokens``.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from temper.rollout.config import SpeculativeConfig
from temper.rollout.decoding import SamplingParams, scaled_logits
from temper.rollout.draft_cost import Acceptance, ForwardCost, draft_length
from temper.rollout.kv_cache import crop_cache, kv_of
from temper.rollout.mixed import Segment
from temper.rollout.requests import DecoderHost, EngineRequest
from temper.rollout.standard import StandardDecoder


def propose(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix n-gram of ``tokens``
    (n from ``max_ngram`` down to ``min_ngram``); [] when no such suffix occurred before."""
    if k <= 0 or len(tokens) < 2:
        return []
    arr = np.asarray(tokens)
    length = len(arr)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = arr[length - n:]
        hits = arr[:length - n] == pattern[0]  # candidate starts s in [0, length - n): a token follows each match
        for j in range(1, n):
            hits &= arr[j:length - n + j] == pattern[j]
        starts = np.flatnonzero(hits)
        if starts.size:
            s = int(starts[-1]) + n
            return arr[s:s + k].tolist()
    return []


def verify(logits: torch.Tensor, draft: list[int], params: SamplingParams,
           generator: torch.Generator | None) -> tuple[list[int], list[float] | None, int]:
    """The tokens to emit from the target's ``logits`` [1 + len(draft), vocab] at positions [last, *draft]:
    the accepted drafts and one token of the target's own. Returns (tokens, their log-probabilities when
    ``params.logprobs``, number of drafts accepted)."""
    scaled = scaled_logits(logits, params)
    if params.greedy:
        target = scaled.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < len(draft) and draft[accepted] == target[accepted]:
            accepted += 1
        tokens = target[:accepted + 1]
    else:
        probs = scaled.softmax(dim=-1)
        tokens = []
        for i, x in enumerate(draft):
            if torch.rand((), generator=generator, device=probs.device) < probs[i, x]:
                tokens.append(x)
                continue
            residual = probs[i].clone()
            residual[x] = 0  # p(x) < 1 here, so something remains
            tokens.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
            break
        else:
            tokens.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
        accepted = len(tokens) - 1
    if not params.logprobs:
        return tokens, None, accepted
    rows = torch.arange(len(tokens), device=scaled.device)
    lp = scaled.log_softmax(dim=-1)[rows, torch.tensor(tokens, device=scaled.device)]
    return tokens, lp.tolist(), accepted


class LookupDecoder(StandardDecoder):
    """Prompt-lookup speculative decoding for one-row requests; the standard profile's step for groups.

    In mixed batches (the engine's default) a request's ``[last, *drafts]`` is its segment of the one forward
    every running request shares, with logits at every position (``mixed.py``); otherwise ``step`` runs
    the request's own forward. Either way ``_settle`` verifies, emits and crops."""

    slot_decode = False  # the slot pool's static forward decodes one token per row

    def __init__(self, engine: DecoderHost, spec: SpeculativeConfig) -> None:
        super().__init__(engine)
        self.spec = spec
        self.cost = ForwardCost()
        self.stats = {"steps": 0, "proposed": 0, "accepted": 0, "emitted": 0}

    def observe(self, positions: int, rows: int, seconds: float, prefill: bool) -> None:
        """The engine's mixed forward just run (``positions`` new positions, ``rows`` decode rows): its cost."""
        if not prefill:
            self.cost.observe(positions, rows, seconds)

    def begin(self, req: EngineRequest, logits: torch.Tensor) -> None:
        req.extra["acceptance"] = Acceptance()
        super().begin(req, logits)

    def _propose(self, req: EngineRequest) -> list[int]:
        x = req.extra
        if x.get("skip", 0) > 0:  # drafts were not worth it lately: plain steps for a while
            x["skip"] -= 1
            return []
        p, sample = req.params, req.samples[req.active[0]]
        seq = req.prompt + sample.token_ids
        # drafts past the token budget or the context could never be emitted
        room = min(p.max_tokens - len(sample.token_ids), self.engine.context - len(seq)) - 1
        if self.cost.fit() is None:  # what a position costs is not measured yet
            k = min(self.spec.num_assistant_tokens, room)
        else:
            a, k_max = x["acceptance"], min(self.spec.max_draft_tokens, room)
            k = draft_length(a.first, a.then, self._draft_cost, k_max)
            if k == 0 and draft_length(1.0, 1.0, self._draft_cost, k_max) == 0:
                return []  # not even drafts certain to be accepted would pay here (a draft model as slow as the
                # target): decode as standard, no probes
        if k == 0 and room > 0:
            if not x.get("probe"):
                self._back_off(x)
                return []
            probe = self._probe(req, seq)
            if probe:
                x.pop("probe")
            return probe
        return self._drafts(req, seq, k)

    def _draft_cost(self, k: int) -> float:
        """What ``k`` draft tokens cost, in emitted tokens' worth of time: here only their verified positions."""
        return self.cost.draft_cost(k)

    def _drafts(self, req: EngineRequest, seq: list[int], k: int) -> list[int]:
        return propose(seq, k, self.spec.max_ngram)

    def _probe(self, req: EngineRequest, seq: list[int]) -> list[int]:
        """After a back-off, one token to learn whether the request copies now: only where the text repeats its
        last max_ngram tokens (a copied span starting), not on any token seen before. A probe on a one-token
        match costs a verify step (+40-60% of a CPU forward) and almost never pays in chat."""
        return propose(seq, 1, self.spec.max_ngram, min_ngram=self.spec.max_ngram)

    @staticmethod
    def _back_off(x: dict) -> None:
        """Skip drafting for the next 1, 2, 4 .. 16 steps (doubling each time, reset by an acceptance), then probe."""
        x["skip"] = x.get("backoff", 1)
        x["backoff"] = min(16, 2 * x["skip"])
        x["probe"] = True

    def segment(self, req: EngineRequest) -> Segment:
        if len(req.active) != 1:
            req.extra["draft"] = None
            return super().segment(req)
        draft = req.extra["draft"] = self._propose(req) or None
        if draft is None:  # nothing to verify: exactly the standard profile's decode row
            self._plain_step()
            return super().segment(req)
        last = req.samples[req.active[0]].token_ids[-1]
        return Segment(req.cache, [[last, *draft]], req.cache.get_seq_length(), every_position=True)

    def advance(self, req: EngineRequest, logits: torch.Tensor) -> None:
        draft = req.extra.pop("draft", None)
        if draft is None:
            return super().advance(req, logits)
        self._settle(req, logits, draft)

    @torch.no_grad()
    def step(self, req: EngineRequest) -> None:
        if len(req.active) != 1:
            return super().step(req)
        e = self.engine
        draft = self._propose(req)
        t0 = time.perf_counter()
        if not draft:
            self._plain_step()
            super().step(req)
            self.cost.observe(1, 1, time.perf_counter() - t0)  # this request's own forward, one position
            return
        start = req.cache.get_seq_length()  # the cache holds the sequence but its last token
        ids = torch.tensor([[req.samples[req.active[0]].token_ids[-1], *draft]], device=e.device)
        pos = torch.arange(start, start + ids.shape[1], device=e.device).unsqueeze(0)
        out = e.model(input_ids=ids, cache=req.cache, position_ids=pos, use_cache=True)
        self.cost.observe(ids.shape[1], 1, time.perf_counter() - t0)
        e._log(req, "decode", 1, f"lookup {len(draft)} drafts")
        self._settle(req, out.logits[0], draft)

    def _verify(self, logits: torch.Tensor, draft: list[int], req: EngineRequest):
        return verify(logits, draft, req.params, req.generator)

    def _plain_step(self) -> None:
        self.stats["steps"] += 1
        self.stats["emitted"] += 1  # a standard step: one token for the one row

    def _settle(self, req: EngineRequest, logits: torch.Tensor, draft: list[int]) -> None:
        """Verify ``draft`` (never empty: a step without one is the standard profile's) against the target's
        ``logits`` [1 + len(draft), vocab] (the forward has appended ``[last, *draft]`` to the cache), emit,
        cut the rejected tail out of the cache, adapt k."""
        e, index = self.engine, req.active[0]
        sample = req.samples[index]
        start = req.cache.get_seq_length() - 1 - len(draft)
        tokens, logprobs, accepted = self._verify(logits, draft, req)
        before = len(sample.token_ids)
        e.accept(req, index, tokens, logprobs)  # appends until the sample finishes (eos, stop, max_tokens)
        emitted = len(sample.token_ids) - before
        if emitted < 1 + len(draft):  # the cache keeps [last, accepted drafts]; the newest token is fed next step
            crop_cache(req.cache, start + emitted)
        s = self.stats
        s["steps"], s["proposed"], s["accepted"], s["emitted"] = (
            s["steps"] + 1, s["proposed"] + len(draft), s["accepted"] + accepted, s["emitted"] + emitted)
        x = req.extra
        x["acceptance"].update(len(draft), accepted)  # what this request's drafts earn (draft_cost.py)
        if accepted:
            x["backoff"] = 1
        else:  # not one token right: skip the next 1, 2, 4 .. 16 steps' drafts (an unaccepted one costs)
            self._back_off(x)
        if sample.finished:
            e.cache_completion(req, index, kv_of(req.cache, 0))
            req.active = []
