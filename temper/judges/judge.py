"""A judge model scores a response against a rubric: a score on the rubric's scale and a rationale.

Two kinds of judge, one interface:
- a local Hugging Face causal LM (a folder): the score is the most likely scale token after
  the rubric prompt's final "Score:" (constrained greedy decoding over the scale's digits), so a
  local judge always answers on the scale, deterministically; its rationale lists the
  probabilities it chose from;
- an OpenAI-compatible endpoint (the embedded rollout engine or vLLM): greedy completion,
  parsed for "Score: N"; an output without a parseable score is a ``JudgeOutputError``.
Every verdict is cached by (rubric, prompt, response, judge) digest.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.errors import TemperError
from temper.judges.cache import JudgeCache, cache_key
from temper.judges.rubric import Rubric

_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+)(?:\s*/\s*(\d+))?", re.IGNORECASE)


class JudgeOutputError(TemperError):
    """The judge's output holds no score on the rubric's scale."""


@dataclass(frozen=True)
class JudgeVerdict:
    score: int
    reward: float  # score mapped to [0, 1]
    rationale: str
    cached: bool = False


def parse_score(text: str, rubric: Rubric, item: str = "item") -> tuple[int, str]:
    """'Score: 4 - concise and correct' -> (4, 'concise and correct'); errors name the item."""
    m = _SCORE.search(text) or re.match(r"\s*(-?\d+)(?:\s*/\s*(\d+))?", text)
    if m is None:
        raise JudgeOutputError(f"{item}: judge output has no 'Score: N': {text[:120]!r}")
    score = int(m.group(1))
    if not rubric.scale_min <= score <= rubric.scale_max:
        raise JudgeOutputError(f"{item}: judge score {score} outside the scale {rubric.scale_min}..{rubric.scale_max}")
    rationale = text[m.end():].strip(" -:.\n") or "(no rationale)"
    return score, rationale.splitlines()[0]


class LocalJudge:
    """Constrained greedy scoring with a local HF causal LM; thread-safe (one forward at a time)."""

    def __init__(self, model_dir: str | Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = str(model_dir)
        self.tok = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        self.identity = f"hf:{Path(self.model_dir).resolve()}"
        self._lock = threading.Lock()

    def _score_token_ids(self, rubric: Rubric) -> dict[int, int]:
        ids = {}
        for s in range(rubric.scale_min, rubric.scale_max + 1):
            enc = self.tok(str(s), add_special_tokens=False)["input_ids"]
            if len(enc) != 1:
                raise JudgeOutputError(f"local judge {self.model_dir}: score {s} is not one token; use a 0-9 scale")
            ids[s] = enc[0]
        return ids

    def judge(self, rubric: Rubric, prompt: str, response: str, item: str) -> tuple[int, str]:
        import torch

        text = rubric.judge_prompt(prompt, response) + " "
        ids = self._score_token_ids(rubric)
        enc = self.tok(text, return_tensors="pt")
        with self._lock, torch.inference_mode():
            logits = self.model(**enc).logits[0, -1]
        probs = torch.softmax(logits[list(ids.values())], dim=0)
        score = list(ids)[int(torch.argmax(probs))]
        shown = ", ".join(f"{s}:{p:.2f}" for s, p in zip(ids, probs.tolist()))
        return score, f"constrained choice over the scale ({shown})"


class EndpointJudge:
    """Greedy completion from an OpenAI-compatible server, parsed for the score."""

    def __init__(self, base_url: str, model: str, max_tokens: int = 48, api_key: str = "unused") -> None:
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url.rstrip("/"), api_key=api_key)
        self.model, self.max_tokens = model, max_tokens
        self.identity = f"openai:{base_url.rstrip('/')}:{model}"

    def judge(self, rubric: Rubric, prompt: str, response: str, item: str) -> tuple[int, str]:
        out = self.client.completions.create(model=self.model, prompt=rubric.judge_prompt(prompt, response),
                                             max_tokens=self.max_tokens, temperature=0.0)
        return parse_score(out.choices[0].text, rubric, item)


class CachedJudge:
    """A judge plus the digest cache: the object the verifier family and the flows use."""

    def __init__(self, backend: LocalJudge | EndpointJudge, cache: JudgeCache) -> None:
        self.backend, self.cache = backend, cache

    def score(self, rubric: Rubric, prompt: str, response: str, item: str = "item") -> JudgeVerdict:
        key = cache_key(rubric.digest, prompt, response, self.backend.identity)
        hit = self.cache.get(key)
        if hit is not None:
            return JudgeVerdict(hit["score"], rubric.normalise(hit["score"]), hit["rationale"], cached=True)
        score, rationale = self.backend.judge(rubric, prompt, response, item)
        self.cache.put(key, {"score": score, "rationale": rationale})
        return JudgeVerdict(score, rubric.normalise(score), rationale)


_JUDGES: dict[tuple, CachedJudge] = {}
_JUDGES_LOCK = threading.Lock()


def get_judge(model: str | None = None, base_url: str | None = None, cache_path: str | Path | None = None,
              **kw: Any) -> CachedJudge:
    """One judge per (model, endpoint, cache) per process: loading a model once serves every domain."""
    if bool(model) == bool(base_url) and not (model and base_url):
        raise TemperError("judge: give `model` (a local HF folder) or `base_url` (+ `model` name) of an endpoint")
    from temper.settings import get_settings

    cache_path = Path(cache_path or get_settings().home / "cache" / "judge.sqlite").resolve()
    key = (model, base_url, str(cache_path))
    with _JUDGES_LOCK:
        if key not in _JUDGES:
            backend = EndpointJudge(base_url, model or "default", **kw) if base_url else LocalJudge(model)
            _JUDGES[key] = CachedJudge(backend, JudgeCache(cache_path))
        return _JUDGES[key]
