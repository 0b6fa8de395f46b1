"""The embedded rollout engine: one transformers model, a scheduler loop, chunked prefill, prefix KV reuse.

A request's life: admission (lane, 413/429) -> queued -> prefill (prefix-cache hit, then the rest of
the prompt in chunks of the lane's token budget, one chunk per scheduler step, interleaved with the
decode steps of other requests) -> decode (the ``n`` samples of the request decode as one batch of
rows sharing the prompt's KV: a GRPO group costs one prefill and ``max_tokens`` batched forwards) ->
done.

A scheduler step is, by default (``mixed_batches``), ONE forward over every running request:
their decode rows and prefill chunks laid end to end (``mixed.py``), planned by
``Scheduler.plan_forward`` (decode first, then prefill chunks under ``forward_token_budget``). The
fast profile's verify steps ride in that forward as segments of 1 + k positions (``lookup.py``; its drafts
from n-gram lookup, or from a draft model: ``draft_model.py``). Models ``mixed.py`` does not support, and
``mixed_batches: false``, run one forward per request, lanes taking turns by ``time_share``.
``prompt_reuse()`` counts the prompt tokens no prefill computed (prefix-cache hits, a group's shared rows), logged by GRPO and eval. The prompt's KV, and each finished sample's prompt+completion KV, go into the prefix cache,
so the next request sharing a system prompt / document / group prompt / episode history skips it.

A lane with ``own_process`` (by default the long lane) is served by an engine of its own in another
process, on the other core (``lane_process.py``): this engine admits and queues its requests, forwards
each to that process when the lane's ``max_running`` lets it run, and relays its events, so long
prompts never lengthen the short requests' forwards.

Threading: ``submit`` may be called from any thread; every forward runs on the engine's own thread
(``start()``) or, without a thread, on the caller of ``step()`` / ``run_until_idle()`` (tests,
benchmarks), except a lane process's. Outputs go to a per-request ``sink`` callable, called on the
engine thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

import torch

from temper.rollout.config import EngineConfig
from temper.rollout.decoding import SampleText, SamplingParams, StopChecker
from temper.rollout.device import engine_device, prefix_budget
from temper.rollout.draft_model import DraftModelDecoder
from temper.rollout.errors import EngineClosed
from temper.rollout.kv_cache import PrefixKVCache, cache_from, kv_of
from temper.rollout.lane_process import LaneProcess, usable_cpus
from temper.rollout.lookup import LookupDecoder
from temper.rollout.mixed import Segment, mixed_forward, supports
from temper.rollout.requests import (  # noqa: F401 (re-exported: the engine's public types)
    Delta,
    EngineRequest,
    Event,
    Finished,
    RequestResult,
    Sink,
)
from temper.rollout.scheduler import Lane, Scheduler, StepEvent
from temper.rollout.slots import SlotCache, SlotDecoder
from temper.rollout.standard import StandardDecoder

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, config: EngineConfig, model=None, tokenizer=None, draft=None) -> None:
        # lazy: transformers (800 ms) would load whenever temper.rollout.client is imported
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        dtype = getattr(torch, config.dtype)
        own_weights = model is None
        if model is None:
            self.device = engine_device(config.device)
            model = AutoModelForCausalLM.from_pretrained(config.model_dir, dtype=dtype).to(self.device)
        else:  # a live policy stays where its trainer put it
            self.device = next(model.parameters()).device
        self.model = model
        self.model.eval()
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(config.model_dir)
        _require_full_attention(self.model)
        self.context = config.max_context_tokens or int(self.model.config.max_position_embeddings)
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.scheduler = Scheduler(config.lanes, self.context)
        pc = config.prefix_cache
        self.prefix_cache = PrefixKVCache(prefix_budget(pc.budget_bytes, self.device)) if pc.enabled else None
        spec = config.speculative
        if config.profile == "fast" and spec.method == "draft_model":
            self.decoder = DraftModelDecoder(self, spec, draft)
        elif config.profile == "fast":
            self.decoder = LookupDecoder(self, spec)
        else:
            self.decoder = StandardDecoder(self)
        # one forward per step over all running requests (see scheduler.py and mixed.py)
        self.mixed = config.mixed_batches and self.decoder.mixes and supports(self.model)
        # decode steps from a static KV slot pool, as CUDA graphs on a GPU (slots.py): the mixed path's decode rows
        # launch attention per request, which on a GPU costs more than the step's arithmetic
        self.slot_decoder: SlotDecoder | None = None
        if self.mixed and self.decoder.slot_decode and (
                config.slot_decode == "on" or config.slot_decode == "auto" and self.device.type == "cuda"):
            self.slot_decoder = SlotDecoder(self.model, config.decode_slots,
                                            min(config.decode_slot_tokens, self.context), graphs=self.device.type == "cuda")
        # lanes with own_process: served by an engine process over model_dir's weights (lane_process.py), so only
        # when this engine's model came from there (not a live policy), and only with a core for it (on one CPU
        # the two processes would take turns: no gain, the second copy of the weights spent). Not on a GPU: the
        # lane would share the device anyway, and a GPU forward's cost hardly grows with its rows
        self.lane_processes: dict[str, LaneProcess] = {}
        if own_weights and draft is None and self.device.type == "cpu" and usable_cpus() >= 2:
            threads = config.lane_process_threads
            self.lane_processes = {lane.name: LaneProcess(type(self), config, lane.name, threads, self._on_lane_event)
                                   for lane in config.lanes if lane.own_process}
        self._lane_events: deque[tuple[EngineRequest, Event]] = deque()
        self.step_log: deque[StepEvent] = deque(maxlen=config.step_log_size)
        self.steps = 0
        self.busy_s = 0.0  # seconds spent in forwards (benchmarks: the engine's busy share of a window)
        # prompt_tokens: prompt tokens of every sample (a group of n counts n prompts); reused: those no
        # prefill forward computed (prefix-cache hits, and the n - 1 copies a group shares); see prompt_reuse()
        self.counters = {"prefill_tokens": 0, "decode_tokens": 0, "requests": 0, "errors": 0, "forwards": 0,
                         "prompt_tokens": 0, "prefix_hit_tokens": 0, "group_shared_tokens": 0,
                         "lane_process_tokens": 0}
        self._ids = itertools.count()
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- tokenization ----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # -- submission ------------------------------------------------------------------------------
    def submit(self, prompts: list[list[int]], params: SamplingParams, sinks: list[Sink]) -> list[EngineRequest]:
        """Admit one request per prompt, all or none (raises PromptTooLong / QueueFull / EngineClosed)."""
        if self._closed:
            raise EngineClosed("the engine is shut down", {"name": "closed"})
        reqs = [EngineRequest(id=f"req-{next(self._ids)}", prompt=list(p), params=params, sink=s)
                for p, s in zip(prompts, sinks, strict=True)]
        if not reqs:
            raise ValueError("no prompt given")
        vocab = int(self.model.config.vocab_size)
        for r in reqs:
            if not r.prompt:
                raise ValueError("empty prompt")
            if min(r.prompt) < 0 or max(r.prompt) >= vocab:
                raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if params.logprobs and not self.decoder.supports_logprobs:
            raise ValueError(f"logprobs are not available in the '{self.config.profile}' profile")
        with self._lock:
            self.scheduler.admit([(r, len(r.prompt), params.max_tokens) for r in reqs])
            self.counters["requests"] += len(reqs)
            self._wake.notify_all()
        return reqs

    def cancel(self, req: EngineRequest) -> None:
        """Stop a request (client went away): a queued one leaves now, a running one at the next step."""
        req.cancelled = True
        with self._lock:
            if req.state == "queued":
                self._finish(req, error="cancelled")
            self._wake.notify_all()

    # -- the scheduler loop ----------------------------------------------------------------------
    def step(self) -> int:
        """One scheduler iteration. Returns the number of work units run (0 = nothing to do)."""
        with self._lock:
            relayed = self._relay_lane_events()
            for req in self.scheduler.promote():
                self._begin(req)
            for lane in self.scheduler.lanes:
                for req in [r for r in lane.running if r.cancelled]:
                    self._finish(req, error="cancelled")
            if self.mixed:
                plan = self.scheduler.plan_forward(self.config.forward_token_budget, self._cached_prefix)
        if self.mixed:
            t0 = time.perf_counter()
            units = self._run_mixed(plan) + relayed
            self.busy_s += time.perf_counter() - t0
            self.steps += 1
            return units
        with self._lock:
            lanes = self.scheduler.lanes_to_run(elsewhere=frozenset(self.lane_processes))
            work = [(lane, list(lane.running)) for lane in lanes]
        units = relayed
        for lane, reqs in work:
            t0 = time.perf_counter()
            units += self._run_lane(lane, reqs)
            with self._lock:
                self.scheduler.charge(lane, time.perf_counter() - t0)
            self.busy_s += time.perf_counter() - t0
        self.steps += 1
        return units

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_work:
                return
            if self.step() == 0:
                self._idle_wait()
        raise RuntimeError(f"engine still busy after {max_steps} steps")

    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rollout-engine", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        for proc in self.lane_processes.values():
            proc.close()
        with self._lock:
            self._relay_lane_events()  # what the processes finished before they stopped
            for lane in self.scheduler.lanes:
                for req in list(lane.queue) + list(lane.running):
                    self._finish(req, error="engine shut down")

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self.scheduler.has_work:
                    self._wake.wait(timeout=1.0)
                if self._closed:
                    return
            try:
                if self.step() == 0:
                    self._idle_wait()
            except Exception:  # a bug in the loop must not kill serving silently
                log.exception("rollout engine step failed")
                time.sleep(0.1)

    def _idle_wait(self) -> None:
        """Nothing ran this step. When a lane process holds requests, that is what the engine waits for:
        sleep until it reports (or a request arrives) instead of spinning on the engine's core."""
        with self._lock:
            if any(p.held for p in self.lane_processes.values()) and not self._lane_events and not self._closed:
                self._wake.wait(timeout=0.05)

    # -- convenience: blocking generation --------------------------------------------------------
    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams,
                 timeout_s: float | None = None) -> list[RequestResult]:
        """Submit every prompt, wait for all; steps the engine itself when no thread runs it."""
        ids = [self.encode(p) if isinstance(p, str) else p for p in prompts]
        collected: list[dict[str, Any]] = [{"done": threading.Event(), "finished": None} for _ in ids]

        def sink_for(slot: dict[str, Any]) -> Sink:
            def sink(ev: Event) -> None:
                if isinstance(ev, Finished):
                    slot["finished"] = ev
                    slot["done"].set()
            return sink

        reqs = self.submit(ids, params, [sink_for(c) for c in collected])
        if self._thread is None:
            self.run_until_idle()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        out = []
        for req, slot in zip(reqs, collected):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not slot["done"].wait(left):
                raise TimeoutError(f"{req.id} not finished after {timeout_s}s")
            fin: Finished = slot["finished"]
            ttft = None if req.first_token_at is None else req.first_token_at - req.submitted_at
            out.append(RequestResult(len(req.prompt), fin.cached_tokens, req.samples, ttft,
                                     req.extra.get("finished_at", time.perf_counter()) - req.submitted_at, fin.error))
        return out

    # -- internals -------------------------------------------------------------------------------
    def _begin(self, req: EngineRequest) -> None:
        p = req.params
        req.samples = [SampleText(i) for i in range(p.n)]
        if req.lane in self.lane_processes:
            req.state = "elsewhere"
            try:
                self.lane_processes[req.lane].submit(req)
            except Exception as e:
                self._failed(req, e)
            return
        req.generator = None if p.greedy else torch.Generator(self.device).manual_seed(
            p.seed if p.seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        req.stopper = StopChecker(self.tokenizer, self.eos_ids, p, len(req.prompt), self.context)
        req.state = "prefill" if self.decoder.needs_prefill else "decode"
        if req.state == "decode":
            self.decoder.begin(req, None)

    def _cached_prefix(self, tokens: list[int]) -> int:
        return self.prefix_cache.peek(tokens) if self.prefix_cache is not None else len(tokens)

    def _start_prefill(self, req: EngineRequest) -> None:
        """At the request's first prefill chunk (not at admission: a request ahead of it may be about to
        cache the prefix they share): the longest cached prefix of its prompt, and the reuse counters."""
        hit = self.prefix_cache.match(req.prompt, max_length=len(req.prompt) - 1) if self.prefix_cache else None
        req.cache = cache_from(hit.kv if hit else None, self.model.config,
                               reserve=len(req.prompt) + min(req.params.max_tokens, 512))
        req.prefilled = req.cached_tokens = hit.length if hit else 0
        self._count_prompt(req)

    def _count_prompt(self, req: EngineRequest) -> None:
        n = req.params.n
        self.counters["prompt_tokens"] += len(req.prompt) * n
        self.counters["prefix_hit_tokens"] += req.cached_tokens
        self.counters["group_shared_tokens"] += len(req.prompt) * (n - 1)

    def _on_lane_event(self, req: EngineRequest, ev: Event) -> None:
        """(a lane process's reader thread) Queue its event for the engine's thread, which owns the sinks."""
        with self._lock:
            self._lane_events.append((req, ev))
            self._wake.notify_all()

    def _relay_lane_events(self) -> int:
        """(lock held) The lane processes' events since the last step: a ``Delta`` extends the request's sample
        and goes to its sink; a ``Finished`` ends the request, with the process's prefix-cache hit counted here.
        Returns how many were relayed."""
        relayed = 0
        while self._lane_events:
            req, ev = self._lane_events.popleft()
            relayed += 1
            if req.state != "elsewhere":
                continue  # ended here meanwhile (cancelled, shut down)
            if isinstance(ev, Delta):
                sample = req.samples[ev.index]
                sample.token_ids += ev.token_ids
                sample.logprobs += ev.logprobs or []
                sample.text += ev.text
                sample.shown = len(sample.text)
                sample.finish_reason = ev.finish_reason
                if req.first_token_at is None and ev.token_ids:
                    req.first_token_at = time.perf_counter()
                self.counters["decode_tokens"] += len(ev.token_ids)
                req.sink(replace(ev, request_id=req.id))
                continue
            if ev.error is None:
                req.cached_tokens = ev.cached_tokens
                self._count_prompt(req)
                computed = len(req.prompt) - ev.cached_tokens
                self.counters["prefill_tokens"] += computed
                self.counters["lane_process_tokens"] += computed
                self._log(req, "prefill", computed, "(lane process)")
            else:
                self.counters["errors"] += 1
            self._finish(req, error=ev.error)
        return relayed

    def _run_mixed(self, plan: list[tuple[EngineRequest, str, int]]) -> int:
        """One forward over the plan's decode rows and prefill chunks (``mixed.py``), then each request's
        tokens. A failing forward fails every request in it: their caches may hold a partial update."""
        items, segments, slotted = [], [], []
        decode_rows, prefilling = 0, False
        for req, kind, n in plan:
            if req.cancelled:
                with self._lock:
                    self._finish(req, error="cancelled")
                continue
            if isinstance(req.cache, SlotCache):  # decodes from the slot pool (slots.py), outside the mixed forward
                slotted.append(req)
            elif kind == "decode":
                segments.append(self.decoder.segment(req))
                decode_rows += len(segments[-1].tokens)
            else:
                prefilling = True
                if req.cache is None:
                    self._start_prefill(req)
                lo = req.prefilled
                n = min(n, len(req.prompt) - lo)
                segments.append(Segment(req.cache, [req.prompt[lo:lo + n]], lo, want_logits=lo + n == len(req.prompt)))
            items.append((req, kind, n))
        if not items:
            return 0
        try:
            t0 = time.perf_counter()
            mixed = iter(mixed_forward(self.model, segments) if segments else [])
            if segments:  # what the forward cost (the fast profile sizes its drafts by it, draft_cost.py)
                self.decoder.observe(sum(len(row) for seg in segments for row in seg.tokens), decode_rows,
                                     time.perf_counter() - t0, prefilling)
            pooled = iter(self.slot_decoder.decode(slotted) if slotted else [])
            logits = [next(pooled) if isinstance(req.cache, SlotCache) else next(mixed) for req, _, _ in items]
        except Exception as e:
            log.exception("mixed forward over %d request(s) failed", len(items))
            self.counters["errors"] += len(items)
            with self._lock:
                for req, _, _ in items:
                    self._finish(req, error=f"{type(e).__name__}: {e}")
            return 0
        self.counters["forwards"] += 1
        for (req, kind, n), lg in zip(items, logits):
            try:
                if kind == "decode":
                    self._log(req, "decode", n)
                    self.decoder.advance(req, lg)
                else:
                    req.prefilled += n
                    self.counters["prefill_tokens"] += n
                    self._log(req, "prefill", n, f"{req.prefilled}/{len(req.prompt)}")
                    if req.prefilled == len(req.prompt):
                        self._prefilled(req, lg)
            except Exception as e:
                self._failed(req, e)
                continue
            self._finish_if_done(req)
        return len(items)

    def _failed(self, req: EngineRequest, e: Exception) -> None:
        """One request's step raised: it ends with the error; the engine and the other requests go on."""
        log.exception("request %s failed", req.id)
        self.counters["errors"] += 1
        with self._lock:
            self._finish(req, error=f"{type(e).__name__}: {e}")

    def _finish_if_done(self, req: EngineRequest) -> None:
        if req.state == "decode" and not req.active:
            with self._lock:
                self._finish(req)

    def _prefilled(self, req: EngineRequest, logits: torch.Tensor) -> None:
        """The prompt's KV is complete: keep it in the prefix cache, start decoding from its last logits."""
        if self.prefix_cache is not None:
            self.prefix_cache.insert(req.prompt, kv_of(req.cache, 0))
        req.state = "decode"
        self.decoder.begin(req, logits)
        if self.slot_decoder is not None and req.active:
            self.slot_decoder.adopt(req)  # no free slots or too long: it decodes in the mixed forward instead

    def _run_lane(self, lane: Lane, reqs: list[EngineRequest]) -> int:
        budget = lane.config.prefill_chunk_tokens
        units = 0
        for req in reqs:
            if req.cancelled:
                with self._lock:
                    self._finish(req, error="cancelled")
                continue
            try:
                if req.state == "prefill":
                    if budget <= 0:
                        continue
                    budget -= self._prefill_chunk(req, budget)
                elif req.state == "decode":
                    self.decoder.step(req)
                units += 1
            except Exception as e:
                self._failed(req, e)
                continue
            self._finish_if_done(req)
        return units

    @torch.no_grad()
    def _prefill_chunk(self, req: EngineRequest, budget: int) -> int:
        if req.cache is None:
            self._start_prefill(req)
        n = min(budget, len(req.prompt) - req.prefilled)
        lo = req.prefilled
        out = self.model(input_ids=torch.tensor([req.prompt[lo:lo + n]], device=self.device), cache=req.cache,
                         position_ids=torch.arange(lo, lo + n, device=self.device).unsqueeze(0), use_cache=True,
                         logits_to_keep=1)
        req.prefilled += n
        self.counters["prefill_tokens"] += n
        self._log(req, "prefill", n, f"{req.prefilled}/{len(req.prompt)}")
        if req.prefilled == len(req.prompt):
            self._prefilled(req, out.logits[:, -1])
        return n

    def _finish(self, req: EngineRequest, error: str | None = None) -> None:
        """Remove from its lane and tell the sink; called with the lock held."""
        if req.state == "done":
            return
        if req.state == "elsewhere":
            self.lane_processes[req.lane].forget(req)
        self.scheduler.remove(req)
        req.state = "done"
        if isinstance(req.cache, SlotCache):
            req.cache.release()
        req.cache = None
        req.extra.pop("caches", None)
        req.extra["finished_at"] = time.perf_counter()
        for s in req.samples:
            if s.finish_reason is None:
                s.finish_reason = "abort" if error else "stop"
        self._log(req, "finish", 0, error or "")
        req.sink(Finished(req.id, len(req.prompt), sum(len(s.token_ids) for s in req.samples), req.cached_tokens,
                          error))

    def _log(self, req: EngineRequest, kind: str, tokens: int, detail: str = "") -> None:
        self.step_log.append(StepEvent(self.steps, req.lane, req.id, kind, tokens, detail))

    def accept(self, req: EngineRequest, index: int, tokens: list[int], logprobs: list[float] | None = None) -> None:
        """Append tokens to sample ``index`` (stopping at its finish), and stream what can be shown."""
        sample = req.samples[index]
        new: list[int] = []
        for i, tok in enumerate(tokens):
            req.stopper.append(sample, tok)
            new.append(tok)
            if logprobs is not None:
                sample.logprobs.append(logprobs[i])
            if sample.finished:
                break
        if req.first_token_at is None and new:
            req.first_token_at = time.perf_counter()
        self.counters["decode_tokens"] += len(new)
        text = req.stopper.take_delta(sample)
        if text or new:
            req.sink(Delta(req.id, index, text, new, sample.finish_reason,
                           logprobs[:len(new)] if logprobs is not None else None))

    def cache_completion(self, req: EngineRequest, index: int, kv) -> None:
        """Keep prompt + completion KV of a finished sample for the next turn of its episode."""
        if self.prefix_cache is None or not self.config.prefix_cache.cache_completions:
            return
        length = kv[0][0].shape[-2]
        tokens = (req.prompt + req.samples[index].token_ids)[:length]
        if len(tokens) > len(req.prompt):
            self.prefix_cache.insert(tokens, kv)

    def prompt_reuse(self) -> dict[str, float]:
        """Prompt tokens reused instead of prefilled, over every sample of every request so far.

        ``prompt_tokens`` counts each sample's prompt (a GRPO group of G counts G prompts: G - 1 of them
        are shared rows of one prefill); ``reused_tokens`` = prefix-cache hits + those shared copies;
        ``hit_rate`` = reused / prompt tokens. A fresh group's rate is (G - 1) / G; a second request
        reading the same document reuses the document's tokens from the prefix cache. Both fast
        profiles prefill as standard does.
        """
        c = self.counters
        reused = c["prefix_hit_tokens"] + c["group_shared_tokens"]
        return {"prompt_tokens": c["prompt_tokens"], "prefix_hit_tokens": c["prefix_hit_tokens"],
                "group_shared_tokens": c["group_shared_tokens"], "reused_tokens": reused,
                "hit_rate": reused / c["prompt_tokens"] if c["prompt_tokens"] else 0.0}

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"steps": self.steps, **self.counters, "lanes": self.scheduler.depth(),
                    "prefix_cache": self.prefix_cache.stats() if self.prefix_cache else None,
                    "prompt_reuse": self.prompt_reuse(), "mixed_batches": self.mixed,
                    "slot_decode": None if self.slot_decoder is None else {
                        "steps": self.slot_decoder.steps, "graphs": self.slot_decoder.captures,
                        "slots": self.slot_decoder.pool.slots, "free": self.slot_decoder.pool.free,
                        "pool_bytes": self.slot_decoder.pool.nbytes},
                    "lane_processes": {name: {"pid": p.pid, "starts": p.starts, "held": len(p.held),
                                              "prefilled_tokens": p.prefilled_tokens}
                                       for name, p in self.lane_processes.items()},
                    "profile": self.config.profile}


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    out = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        out.add(tokenizer.eos_token_id)
    return out


def _require_full_attention(model) -> None:
    # lazy: transformers (800 ms) would load whenever temper.rollout.client is imported
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = DynamicCache(config=model.config).layers
    odd = {type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer}
    if odd:
        raise ValueError(f"the rollout engine's prefix cache supports full-attention models only; this model "
                         f"uses {sorted(odd)}")
