"""Where judge text comes from: a local Hugging Face causal LM folder or an OpenAI-compatible endpoint.

Both decode greedily (temperature 0), which is what makes the digest cache sound. A local
model is loaded once per process and shared by every judge that names the same folder; a
lock serialises generation on it, because verifiers score from many threads at once.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

from temper.judges import JudgeError, JudgeUnavailable

_FULL_HASH_LIMIT = 64 << 20  # bigger weight files are fingerprinted by size + head + tail
_EDGE = 8 << 20
_models: dict[str, tuple[Any, Any, threading.Lock]] = {}
_models_lock = threading.Lock()
_fingerprints: dict[tuple, str] = {}


def folder_fingerprint(path: str | Path) -> str:
    """sha256 over every file of a model folder (name, size, content; head+tail of files > 64 MiB).

    A folder path alone is not an identity (weights get replaced in place), and hashing a
    15 GB checkpoint on every start is too slow; size + first/last 8 MiB catches any
    realistic re-export. Memoised per (path, mtimes) within the process.
    """
    root = Path(path)
    if not (root / "config.json").is_file():
        raise JudgeUnavailable(f"judge model {root} is not a Hugging Face model folder (no config.json)")
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts))
    key = (str(root.resolve()), tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if key in _fingerprints:
        return _fingerprints[key]
    h = hashlib.sha256()
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.relative_to(root).as_posix()}\0{size}\0".encode())
        with p.open("rb") as f:
            if size <= _FULL_HASH_LIMIT:
                h.update(f.read())
            else:
                h.update(f.read(_EDGE))
                f.seek(size - _EDGE)
                h.update(f.read(_EDGE))
    _fingerprints[key] = h.hexdigest()
    return _fingerprints[key]


def _load(path: str) -> tuple[Any, Any, threading.Lock]:
    with _models_lock:
        if path not in _models:
            # lazy: transformers (800 ms) would load in fast unit tests (test_judges_calibration.py)
            from transformers import AutoModelForCausalLM, AutoTokenizer

            try:
                tok = AutoTokenizer.from_pretrained(path)
                model = AutoModelForCausalLM.from_pretrained(path).eval()
            except (OSError, ValueError) as e:
                raise JudgeUnavailable(f"cannot load judge model {path}: {e}") from None
            _models[path] = (tok, model, threading.Lock())
        return _models[path]


class LocalBackend:
    """A local causal LM. Prompts longer than the model's context keep their end (the
    response and the score cue) and are marked ``truncated`` in the cache entry."""

    def __init__(self, path: str, max_new_tokens: int) -> None:
        self.path = str(Path(path).resolve())
        self.max_new_tokens = max_new_tokens

    @property
    def identity(self) -> str:
        return f"hf:{folder_fingerprint(self.path)}"

    def _encode(self, tok: Any, model: Any, prompt: str, reserve: int) -> tuple[Any, bool]:
        # lazy: torch (1.5 s) would load in fast unit tests (test_judges_calibration.py)
        import torch

        ids = tok(prompt, add_special_tokens=True)["input_ids"]
        limit = getattr(model.config, "max_position_embeddings", None) or min(tok.model_max_length, 1 << 20)
        keep = max(1, limit - reserve)
        truncated = len(ids) > keep
        return torch.tensor([ids[-keep:]]), truncated

    def generate(self, prompt: str) -> tuple[str, bool]:
        # lazy: torch (1.5 s) would load in fast unit tests (test_judges_calibration.py)
        import torch

        tok, model, lock = _load(self.path)
        with lock, torch.no_grad():
            ids, truncated = self._encode(tok, model, prompt, self.max_new_tokens)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.max_new_tokens,
                                 do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True), truncated

    def choose(self, prompt: str, options: list[str]) -> str:
        """The option whose (single) token is most likely next: a greedy score that always parses."""
        # lazy: torch (1.5 s) would load in fast unit tests (test_judges_calibration.py)
        import torch

        tok, model, lock = _load(self.path)
        option_ids = []
        for o in options:
            ids = tok(o, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise JudgeError(f"scoring 'choice' needs one token per scale point; {o!r} is {len(ids)} tokens "
                                 f"for {self.path} (use scoring: generate)")
            option_ids.append(ids[0])
        with lock, torch.no_grad():
            ids, _ = self._encode(tok, model, prompt, 1)
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1]
        return options[int(torch.argmax(logits[option_ids]))]


class EndpointBackend:
    """An OpenAI-compatible server's /v1/completions (vLLM, TGI, llama.cpp, a hosted API).

    The ``openai`` client is used when importable (``client: auto``), plain ``requests``
    otherwise; both send temperature 0. ``base_url`` may be given with or without '/v1'.
    """

    def __init__(self, base_url: str, model: str, max_new_tokens: int, timeout_s: float,
                 api_key: str | None = None, client: str = "auto") -> None:
        url = base_url.rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.client = client
        if client == "auto":
            try:
                # lazy: probes whether the optional openai package is installed
                import openai  # noqa: F401

                self.client = "openai"
            except ImportError:
                self.client = "requests"

    @property
    def identity(self) -> str:
        return f"endpoint:{self.base_url}#{self.model}"

    def generate(self, prompt: str) -> tuple[str, bool]:
        return (self._openai(prompt) if self.client == "openai" else self._requests(prompt)), False

    def _openai(self, prompt: str) -> str:
        # lazy: probes whether the optional openai package is installed
        import openai

        client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key or "EMPTY", timeout=self.timeout_s,
                               max_retries=2)
        try:
            out = client.completions.create(model=self.model, prompt=prompt, max_tokens=self.max_new_tokens,
                                            temperature=0)
        except openai.OpenAIError as e:
            raise JudgeError(f"judge endpoint {self.base_url} failed: {type(e).__name__}: {e}") from None
        if not out.choices:
            raise JudgeError(f"judge endpoint {self.base_url} returned no choices")
        return out.choices[0].text or ""

    def _requests(self, prompt: str) -> str:
        # lazy: requests (70 ms) would load in fast unit tests (test_judges_calibration.py)
        import requests

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_new_tokens, "temperature": 0}
        try:
            r = requests.post(self.base_url + "/completions", json=body, headers=headers, timeout=self.timeout_s)
            r.raise_for_status()
            return r.json()["choices"][0].get("text") or ""
        except requests.RequestException as e:
            raise JudgeError(f"judge endpoint {self.base_url} failed: {type(e).__name__}: {e}") from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(f"judge endpoint {self.base_url} returned a body that is not a completion") from None
