"""The subset of the OpenAI completions / chat-completions wire format the embedded server speaks.

Same field names and defaults as OpenAI and vLLM, so one client (the official ``openai`` package)
talks to either. Fields the engine cannot honour (top logprobs, echo, penalties, tools) are refused
with a 400 naming the field rather than silently ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from temper.rollout.decoding import SamplingParams


class UnsupportedField(ValueError):
    def __init__(self, field: str, why: str = "not supported by the embedded engine") -> None:
        super().__init__(f"'{field}' is {why}")
        self.field = field


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=256)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False  # vLLM extension
    return_token_ids: bool = False  # vLLM extension: choices carry prompt_token_ids and token_ids

    def _refuse_unsupported(self) -> None:
        if self.presence_penalty or self.frequency_penalty:
            raise UnsupportedField("presence_penalty" if self.presence_penalty else "frequency_penalty")
        if self.logit_bias:
            raise UnsupportedField("logit_bias")

    def wants_logprobs(self) -> bool:
        return False

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        self._refuse_unsupported()
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(max_tokens=self.max_tokens or default_max_tokens, temperature=self.temperature,
                              top_p=self.top_p, n=self.n, stop=stop, seed=self.seed, ignore_eos=self.ignore_eos,
                              logprobs=self.wants_logprobs())


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def sampling(self, default_max_tokens: int = 16) -> SamplingParams:
        if self.echo:
            raise UnsupportedField("echo")
        if self.logprobs:
            raise UnsupportedField("logprobs", "supported only as 0 (each sampled token's log-probability), "
                                               "not with top alternatives")
        if self.best_of not in (None, self.n):
            raise UnsupportedField("best_of")
        if self.suffix:
            raise UnsupportedField("suffix")
        return super().sampling(default_max_tokens)

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # one tokenized prompt
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise UnsupportedField(f"content part of type {part.get('type')!r}")
            parts.append(part.get("text", ""))
        return "".join(parts)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        if self.top_logprobs:
            raise UnsupportedField("top_logprobs", "not supported (logprobs=true gives each sampled token's)")
        if self.tools:
            raise UnsupportedField("tools")
        if self.max_completion_tokens and not self.max_tokens:
            self.max_tokens = self.max_completion_tokens
        return super().sampling(default_max_tokens)

    def plain_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion_body(rid: str, model: str, choices: list[dict[str, Any]], usage_: dict[str, Any] | None,
                    kind: Literal["text_completion", "chat.completion", "chat.completion.chunk"]) -> dict[str, Any]:
    body: dict[str, Any] = {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def error_body(message: str, type_: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}
