"""Request lanes, admission control and what runs in a scheduler step. No model code here.

Mixed batches (the default; ``plan_forward``): each step is ONE forward over every running request
of every lane, under a per-forward token budget. Every decoding request contributes its rows first
(one token each) and is never held back, so a short request waits at most one budgeted forward
between its tokens. The budget left over goes to prefill chunks, lane by lane in lane order
(shortest prompts first), FIFO within a lane, each lane at most its ``prefill_chunk_tokens`` per
forward. A long prompt is thus prefilled a bounded chunk at a time inside the same forwards that
decode the short requests, and progresses every forward the budget leaves room for, instead of
getting only the forwards short requests leave idle.

Per-request forwards (``mixed_batches: false``, the fast profile, models ``mixed.py`` does not
support; ``lanes_to_run``), the older rule:

A request goes to the first lane whose ``max_prompt_tokens`` it fits (413 when none does, or when
prompt + max_tokens exceeds the context). Each lane has a bounded queue (429 when full) and a
bound on requests in progress. In every step each lane with work runs, except that while two or
more lanes have work, a lane whose ``time_share`` is below 1 runs only while the compute time it
has used in this contended period is within its share of the total. That is how a 4k-token
prefill in the long lane, chunked into small pieces, takes at most ~``time_share`` of the machine
from the short requests instead of stalling them; when the short lane is idle the long lane runs
every step. Shares count measured seconds, not tokens: on small models a forward's cost is mostly
fixed overhead, so a token budget alone would not bound the slowdown.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from temper.rollout.config import LaneConfig
from temper.rollout.errors import PromptTooLong, QueueFull


class Schedulable(Protocol):
    id: str
    lane: str


@dataclass
class Lane:
    config: LaneConfig
    queue: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    used_s: float = 0.0

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def has_work(self) -> bool:
        return bool(self.queue or self.running)


@dataclass(frozen=True)
class StepEvent:
    """One unit of work in the step log: what ran for which request, in which step and lane."""

    step: int
    lane: str
    request_id: str
    kind: str  # "prefill" | "decode" | "finish"
    tokens: int = 0
    detail: str = ""


WAIT_FOR_SHARED_TOKENS = 16


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    def __init__(self, lanes: list[LaneConfig], max_context_tokens: int) -> None:
        self.lanes = [Lane(c) for c in lanes]
        self.by_name = {lane.name: lane for lane in self.lanes}
        self.max_context_tokens = max_context_tokens
        self._contended = False

    def route(self, prompt_tokens: int, max_tokens: int) -> Lane:
        if prompt_tokens + max_tokens > self.max_context_tokens:
            raise PromptTooLong(
                f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the context of "
                f"{self.max_context_tokens} tokens",
                {"name": "max_context_tokens", "value": self.max_context_tokens, "prompt_tokens": prompt_tokens,
                 "max_tokens": max_tokens, "param": "max_tokens"})
        for lane in self.lanes:
            if prompt_tokens <= lane.config.max_prompt_tokens:
                return lane
        last = self.lanes[-1]
        raise PromptTooLong(
            f"prompt of {prompt_tokens} tokens exceeds lane '{last.name}' max_prompt_tokens "
            f"{last.config.max_prompt_tokens}",
            {"name": "max_prompt_tokens", "lane": last.name, "value": last.config.max_prompt_tokens,
             "prompt_tokens": prompt_tokens, "param": "prompt"})

    def admit(self, requests: list[tuple[Any, int, int]]) -> None:
        """Queue ``(request, prompt_tokens, max_tokens)`` triples all together or none (raises 413/429).

        A lane is full when more than ``max_queued`` requests would wait behind its free running slots.
        """
        placed = [(req, self.route(p, m)) for req, p, m in requests]
        demand: dict[str, int] = {}
        for _, lane in placed:
            demand[lane.name] = demand.get(lane.name, 0) + 1
        for name, extra in demand.items():
            lane = self.by_name[name]
            waiting = self._waiting(lane)
            if self._waiting(lane, extra) > lane.config.max_queued:
                raise QueueFull(
                    f"lane '{name}' queue is full ({waiting} waiting, max_queued {lane.config.max_queued}); "
                    f"retry later",
                    {"name": "max_queued", "lane": name, "value": lane.config.max_queued, "queued": waiting})
        for req, lane in placed:
            req.lane = lane.name
            lane.queue.append(req)

    @staticmethod
    def _waiting(lane: Lane, extra: int = 0) -> int:
        """Requests (queued + ``extra``) that would not start at the next step: free running slots take the first."""
        return max(0, len(lane.queue) + extra - max(0, lane.config.max_running - len(lane.running)))

    def promote(self) -> list[Any]:
        """Move queued requests into their lane's running set, up to ``max_running``; returns those moved."""
        moved = []
        for lane in self.lanes:
            while lane.queue and len(lane.running) < lane.config.max_running:
                req = lane.queue.popleft()
                lane.running.append(req)
                moved.append(req)
        return moved

    def lanes_to_run(self, elsewhere: frozenset[str] = frozenset()) -> list[Lane]:
        """Per-request forwards: the lanes whose running requests run this step, by time share. Lanes in
        ``elsewhere`` (a lane process serves them) take no compute here: they neither run nor contend."""
        here = [lane for lane in self.lanes if lane.name not in elsewhere]
        busy = [lane for lane in here if lane.running]
        self._contended = len([lane for lane in here if lane.has_work]) >= 2
        if not self._contended:
            for lane in here:
                lane.used_s = 0.0  # no contended period: time used alone does not count against a lane
            return busy
        total = sum(lane.used_s for lane in busy)
        chosen = [lane for lane in busy
                  if lane.config.time_share >= 1.0 or lane.used_s <= lane.config.time_share * total]
        if not chosen and busy:
            chosen = [min(busy, key=lambda lane: lane.used_s / lane.config.time_share)]
        return chosen

    def plan_forward(self, budget: int,
                     cached_prefix: Callable[[list[int]], int] = lambda tokens: 0) -> list[tuple[Any, str, int]]:
        """The work of the next mixed forward: ``(request, "decode" | "prefill", new tokens)``.

        Decode first: every running request in state ``decode`` with its ``len(active)`` rows, whatever
        the budget. Then prefill: what is left of ``budget``, lane by lane, FIFO within a lane, each
        lane at most its ``prefill_chunk_tokens``, each request at most its unprefilled prompt
        (``len(prompt) - prefilled``). A request not yet started (``cache is None``) that shares with one
        still prefilling ahead of it in its lane a prefix at least ``WAIT_FOR_SHARED_TOKENS`` longer than
        ``cached_prefix(prompt)`` (what the prefix cache holds of it now) waits for that one to finish,
        so the shared part (a document several eval records read) comes from the prefix cache instead
        of being computed twice in the same forwards. Requests in any other state (``elsewhere``: a lane
        process serves them) take nothing. Requests need ``state``, ``active``, ``prompt``, ``prefilled``,
        ``cache``.
        """
        plan: list[tuple[Any, str, int]] = []
        used = 0
        for lane in self.lanes:
            for req in lane.running:
                if req.state == "decode" and req.active:
                    plan.append((req, "decode", len(req.active)))
                    used += len(req.active)
        for lane in self.lanes:
            quota = lane.config.prefill_chunk_tokens
            ahead: list[Any] = []  # requests of this lane still prefilling, in FIFO order
            for req in lane.running:
                if req.state != "prefill":
                    continue
                if req.cache is None and ahead:
                    shared = max(_common(a.prompt, req.prompt) for a in ahead)
                    if shared >= WAIT_FOR_SHARED_TOKENS + cached_prefix(req.prompt):
                        continue  # starts once the one ahead has cached what they share
                ahead.append(req)
                room = min(quota, budget - used)
                if room <= 0:
                    break
                n = min(room, len(req.prompt) - req.prefilled)
                if n <= 0:
                    continue
                plan.append((req, "prefill", n))
                used += n
                quota -= n
        return plan

    def charge(self, lane: Lane, seconds: float) -> None:
        """Count compute time against ``lane``'s share; only time spent while lanes contend counts."""
        if self._contended:
            lane.used_s += seconds

    def remove(self, req: Any) -> None:
        lane = self.by_name[req.lane]
        if req in lane.running:
            lane.running.remove(req)
        elif req in lane.queue:
            lane.queue.remove(req)

    @property
    def has_work(self) -> bool:
        return any(lane.has_work for lane in self.lanes)

    def depth(self) -> dict[str, dict[str, int]]:
        return {lane.name: {"queued": len(lane.queue), "running": len(lane.running)} for lane in self.lanes}
