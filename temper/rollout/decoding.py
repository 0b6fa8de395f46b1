"""Per-token decisions shared by both profiles: sampling parameters, the next token, when a sample stops,
and what text a stream may already show (stop strings are held back until they cannot match)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0, description="0 = greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=256, description="Samples of the same prompt (a GRPO group).")
    stop: list[str] = Field(default_factory=list, max_length=8)
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: bool = Field(default=False, description="Record each sampled token's log-probability.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def scaled_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The logits tokens are drawn from: float32, divided by the temperature, outside top-p masked to -inf
    (unchanged when greedy: argmax and the raw model distribution)."""
    scaled = logits.float()
    if params.greedy:
        return scaled
    scaled = scaled / params.temperature
    if params.top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs > params.top_p  # keeps the first token always
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
    return scaled


def next_tokens(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> tuple[list[int], list[float] | None]:
    """One token per row of ``logits`` [rows, vocab]: argmax when greedy, else temperature + top-p sampling.

    With ``params.logprobs``, also each token's log-probability under the distribution it was drawn
    from (temperature and top-p applied; the raw model distribution when greedy), which is what a
    policy-gradient update compares its own log-probabilities with.
    """
    scaled = scaled_logits(logits, params)
    if params.greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        tokens = torch.multinomial(scaled.softmax(dim=-1), 1, generator=generator).squeeze(-1)
    if not params.logprobs:
        return tokens.tolist(), None
    lp = scaled.log_softmax(dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens.tolist(), lp.tolist()


@dataclass
class SampleText:
    """One sample's generated tokens and the text a stream has shown of them."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    shown: int = 0
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class StopChecker:
    """Applies eos / stop strings / max_tokens / context limit after each appended token."""

    def __init__(self, tokenizer, eos_ids: set[int], params: SamplingParams, prompt_len: int, context: int) -> None:
        self.tokenizer, self.eos_ids, self.params = tokenizer, eos_ids, params
        self.prompt_len, self.context = prompt_len, context
        self.holdback = max((len(s) for s in params.stop), default=1) - 1

    def append(self, sample: SampleText, token: int) -> None:
        sample.token_ids.append(token)
        if token in self.eos_ids and not self.params.ignore_eos:
            sample.finish_reason = "stop"
            return
        sample.text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        for stop in self.params.stop:
            cut = sample.text.find(stop, max(0, sample.shown - len(stop)))
            if cut >= 0:
                sample.text = sample.text[:cut]
                sample.finish_reason = "stop"
                return
        if len(sample.token_ids) >= self.params.max_tokens or \
                self.prompt_len + len(sample.token_ids) >= self.context:
            sample.finish_reason = "length"

    def take_delta(self, sample: SampleText) -> str:
        """Text not yet shown that can be shown now (everything once the sample has finished)."""
        end = len(sample.text)
        if not sample.finished:
            end -= self.holdback
            while end > sample.shown and sample.text[end - 1] == "\ufffd":  # an incomplete multi-byte char
                end -= 1
        if end <= sample.shown:
            return ""
        delta = sample.text[sample.shown:end]
        sample.shown = end
        return delta
