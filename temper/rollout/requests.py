"""What flows between the engine and its decoders: requests, their output events, results.

Kept apart from ``engine.py`` so a decoder (``lookup.py``) can name these types and the narrow
``DecoderHost`` interface it needs without importing the engine that imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from temper.rollout.decoding import SampleText, SamplingParams, StopChecker


@dataclass(frozen=True)
class Delta:
    """New output of one sample: text that may be shown now, the new token ids, the finish reason once done."""

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[float] | None = None  # one per token in token_ids, when the request asked for them


@dataclass(frozen=True)
class Finished:
    request_id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: str | None = None


Event = Delta | Finished
Sink = Callable[[Event], None]


@dataclass(eq=False)
class EngineRequest:
    id: str
    prompt: list[int]
    params: SamplingParams
    sink: Sink
    lane: str = ""
    state: str = "queued"  # queued | prefill | decode | elsewhere (a lane process serves it) | done
    prefilled: int = 0
    cached_tokens: int = 0
    cache: Any = None  # standard profile: DynamicCache with one row per active sample
    samples: list[SampleText] = field(default_factory=list)
    active: list[int] = field(default_factory=list)  # sample indices still decoding, in cache-row order
    extra: dict[str, Any] = field(default_factory=dict)  # per-profile state (the fast profile's caches)
    generator: torch.Generator | None = None
    stopper: StopChecker | None = None
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None


@dataclass
class RequestResult:
    prompt_tokens: int
    cached_tokens: int
    samples: list[SampleText]
    ttft_s: float | None
    latency_s: float
    error: str | None = None

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.samples]

    @property
    def token_ids(self) -> list[list[int]]:
        return [s.token_ids for s in self.samples]


class DecoderHost(Protocol):
    """What a decoder may use of the engine that drives it."""

    model: Any
    tokenizer: Any
    device: Any  # torch.device of the model and of every tensor a step makes
    context: int
    eos_ids: set[int]

    def accept(self, req: EngineRequest, index: int, tokens: list[int],
               logprobs: list[float] | None = None) -> None: ...

    def _log(self, req: EngineRequest, kind: str, tokens: int, detail: str = "") -> None: ...

    def cache_completion(self, req: EngineRequest, index: int, kv) -> None: ...
