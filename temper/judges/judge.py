"""A judge: rubric + prompt + response -> score in [0, 1] and a rationale, cached by digest.

The cache key is the sha256 of everything that decides the output: the rubric digest, the
prompt, the response, the reference (when the domain shows one), the judge's identity (a
fingerprint of the model folder, or endpoint + served model, or a pinned ``judge_id``),
the decoding settings and the judge-prompt version. A second call with the same inputs
reads the stored output instead of running the model, so re-scoring is free and exactly
reproducible. An output without a parseable score raises ``JudgeError`` naming the item;
callers skip and count it, never score it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from temper.judges import JudgeError, UnparseableOutput
from temper.judges.backends import EndpointBackend, LocalBackend
from temper.judges.cache import JudgeCache
from temper.judges.parse import ScoreParseError, parse_score
from temper.judges.rubric import Rubric

#: Bump when the judge prompt below changes: it is part of every cache key.
PROMPT_VERSION = 1


class JudgeSpec(BaseModel):
    """Which model judges and how. Exactly one of ``model`` (local folder) or ``base_url``."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, description="Local Hugging Face causal LM folder.")
    base_url: str | None = Field(default=None, description="OpenAI-compatible server, e.g. http://host:8000/v1.")
    endpoint_model: str | None = Field(default=None, description="Model name the endpoint serves (with base_url).")
    api_key_env: str | None = Field(default=None, description="Env var holding the endpoint's API key, if any.")
    client: Literal["auto", "openai", "requests"] = Field(
        default="auto", description="HTTP client for base_url: openai when importable (auto), or plain requests.")
    scoring: Literal["generate", "choice"] = Field(
        default="generate",
        description="generate: parse 'Score: N' from greedy text. choice (local only): greedy one-line rationale, "
        "then the most likely scale point as the next token, so the score always parses.")
    max_new_tokens: int = Field(default=128, ge=1, le=4096, description="Greedy tokens of judge output.")
    timeout_s: float = Field(default=60, gt=0, description="Endpoint request timeout.")
    judge_id: str | None = Field(
        default=None, description="Pinned identity for the cache key (e.g. 'qwen2.5-7b-instruct@rev'); "
        "default: a fingerprint of the model folder, or endpoint URL + served model.")

    @model_validator(mode="after")
    def _one_source(self) -> "JudgeSpec":
        if (self.model is None) == (self.base_url is None):
            raise ValueError("give exactly one of judge.model (a local folder) or judge.base_url (an endpoint)")
        if self.base_url is not None and not self.endpoint_model:
            raise ValueError("judge.base_url needs judge.endpoint_model (the model name the server serves)")
        if self.base_url is not None and self.scoring == "choice":
            raise ValueError("scoring 'choice' needs next-token logits: local judge.model only")
        return self


@dataclass(frozen=True)
class JudgeResult:
    item_id: str
    score: float  # in [0, 1]
    raw_score: float  # on the rubric scale
    rationale: str
    digest: str
    cached: bool
    judge_id: str
    rubric_digest: str


def render_judge_prompt(rubric: Rubric, prompt: str, response: str, reference: str | None = None) -> str:
    """The text the judge reads. Ends with the rationale cue; the score line follows it."""
    s = rubric.scale
    lines = [f"You are grading a response with the rubric '{rubric.name}'."]
    if rubric.description:
        lines.append(rubric.description)
    lines.append("Criteria:")
    lines += [f"- {c.name}: {c.description}" for c in rubric.criteria]
    lines.append(f"Scale: an integer from {s.min} (worst) to {s.max} (best).")
    lines += [f"  {k}: {v}" for k, v in sorted(s.labels.items())]
    for ex in rubric.examples:
        lines += ["", "Example prompt:", ex.prompt, "Example response:", ex.response,
                  f"Rationale: {ex.rationale}".rstrip(), f"Score: {ex.score}/{s.max}"]
    lines += ["", "Prompt:", prompt]
    if reference is not None:
        lines += ["Reference answer:", reference]
    lines += ["Response:", response, "",
              f"Write a one-line rationale, then a line 'Score: N/{s.max}'.", "Rationale:"]
    return "\n".join(lines)


class Judge:
    """Scores items with one judge spec. ``stats`` counts cache hits, model calls and unparseable outputs."""

    def __init__(self, spec: JudgeSpec | dict[str, Any], cache: JudgeCache | None = None) -> None:
        self.spec = spec if isinstance(spec, JudgeSpec) else JudgeSpec.model_validate(spec)
        self.cache = cache or JudgeCache()
        if self.spec.model is not None:
            self.backend: LocalBackend | EndpointBackend = LocalBackend(self.spec.model, self.spec.max_new_tokens)
        else:
            key = os.environ.get(self.spec.api_key_env) if self.spec.api_key_env else None
            self.backend = EndpointBackend(self.spec.base_url, self.spec.endpoint_model, self.spec.max_new_tokens,
                                           self.spec.timeout_s, api_key=key, client=self.spec.client)
        self.stats = {"cache_hits": 0, "judged": 0, "unparseable": 0}
        self._lock = threading.Lock()
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        if self._identity is None:
            self._identity = self.spec.judge_id or self.backend.identity
        return self._identity

    def digest(self, rubric: Rubric, prompt: str, response: str, reference: str | None = None) -> str:
        key = {"v": PROMPT_VERSION, "rubric": rubric.digest, "prompt": prompt, "response": response,
               "reference": reference, "judge": self.identity, "scoring": self.spec.scoring,
               "max_new_tokens": self.spec.max_new_tokens}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _run(self, rubric: Rubric, text: str) -> tuple[str, bool]:
        if self.spec.scoring == "generate":
            return self.backend.generate(text)
        rationale, truncated = self.backend.generate(text)
        rationale = rationale.split("\n", 1)[0].split("Score", 1)[0].strip()
        cued = f"{text} {rationale}\nScore: "
        point = self.backend.choose(cued, [str(p) for p in rubric.scale.points])
        return f"{rationale}\nScore: {point}/{rubric.scale.max}", truncated

    def score(self, rubric: Rubric, prompt: str, response: str, *, reference: str | None = None,
              item_id: str = "?") -> JudgeResult:
        digest = self.digest(rubric, prompt, response, reference)
        entry = self.cache.get(digest)
        cached = entry is not None
        if cached:
            self._count("cache_hits")
        else:
            try:
                output, truncated = self._run(rubric, render_judge_prompt(rubric, prompt, response, reference))
            except JudgeError as e:
                raise JudgeError(f"item {item_id} (rubric {rubric.name}): {e}") from None
            entry = {"output": output, "truncated": truncated, "judge": self.identity, "rubric": rubric.name,
                     "rubric_digest": rubric.digest, "item_id": item_id, "prompt_version": PROMPT_VERSION}
            self.cache.put(digest, entry)
            self._count("judged")
        try:
            parsed = parse_score(entry["output"], rubric.scale)
        except ScoreParseError as e:
            self._count("unparseable")
            raise UnparseableOutput(f"item {item_id} (rubric {rubric.name}, judge output {digest[:12]}): {e}") from None
        return JudgeResult(item_id=item_id, score=rubric.scale.normalize(parsed.raw), raw_score=parsed.raw,
                           rationale=parsed.rationale, digest=digest, cached=cached, judge_id=self.identity,
                           rubric_digest=rubric.digest)
