"""One rollout client for both backends: the official ``openai`` package against an OpenAI-compatible server.

The rollout section of the settings (``get_settings().rollout``, ``TEMPER_ROLLOUT_*``) picks the
server: ``vllm`` -> the vLLM Service at ``base_url``; ``embedded`` -> ``base_url`` of a running
``temper serve``, or (no base_url) the engine started in this process on 127.0.0.1. Everything after that is the same HTTP client, so eval and GRPO
code never branch on the backend.

For eval: ``generate(prompts, max_tokens, temperature=0)`` -> one greedy completion per prompt.
For GRPO: ``generate(prompts, max_tokens, temperature=1.0, n=G)`` -> a group of G per prompt (one
request per prompt with ``n``, so the server prefills the prompt once and decodes the group as a
batch). For agents: ``ChatPolicy`` is a ``temper.agent.episodes.Policy`` whose episode is one growing chat,
so each turn reuses the KV of the turns before it.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from dataclasses import dataclass
from typing import Any

from openai import APIStatusError, OpenAI

from temper.core.settings import RolloutSettings, get_settings
from temper.rollout.config import engine_config
from temper.rollout.engine import Engine
from temper.rollout.server import EmbeddedServer


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int  # of the request this completion came from (shared by its n samples)
    completion_tokens: int  # summed over the request's n samples
    cached_tokens: int
    token_ids: list[int] | None = None  # with return_token_ids (embedded server, vLLM >= 0.10.2)
    prompt_token_ids: list[int] | None = None
    logprobs: list[float] | None = None  # with logprobs=True: each sampled token's log-probability


class RolloutClient:
    def __init__(self, settings: RolloutSettings | None = None, **overrides: Any) -> None:
        """``settings``: the process's rollout settings unless given; ``overrides`` replace some of their fields."""
        settings = settings or get_settings().rollout
        if overrides:
            settings = RolloutSettings.model_validate({**settings.model_dump(), **overrides})
        self.settings = settings.checked()
        self._server = None
        base_url = self.settings.base_url
        if base_url is None:
            self._server = EmbeddedServer(Engine(engine_config(self.settings)))
            base_url = self._server.start()
        self.base_url = base_url
        self.openai = OpenAI(base_url=base_url, api_key=self.settings.api_key, timeout=self.settings.timeout_s,
                             max_retries=self.settings.max_retries)

    # -- completions -----------------------------------------------------------------------------
    def complete(self, prompt: str | list[int], *, max_tokens: int, temperature: float, n: int = 1,
                 top_p: float = 1.0, stop: list[str] | None = None, seed: int | None = None,
                 logprobs: bool = False, return_token_ids: bool = False) -> list[Completion]:
        r = self.openai.completions.create(
            model=self.settings.model, prompt=prompt, max_tokens=max_tokens, temperature=temperature, n=n,
            top_p=top_p, stop=stop or None, seed=seed, logprobs=0 if logprobs else None,
            extra_body={"return_token_ids": True} if return_token_ids else None)
        return _choices(r, lambda c: c.text,
                        lambda c: c.logprobs.token_logprobs if c.logprobs is not None else None)

    def generate(self, prompts: list[str] | list[list[int]], max_tokens: int = 256, temperature: float = 1.0, *,
                 n: int = 1, top_p: float = 1.0, stop: list[str] | None = None, seed: int | None = None,
                 logprobs: bool = False, return_token_ids: bool = False,
                 skip_too_long: bool = False) -> list[list[Completion]]:
        """``n`` completions per prompt (text or token ids), in prompt order; up to ``settings.concurrency``
        requests in flight. ``skip_too_long``: a prompt the server refuses as longer than its context
        gets ``[]`` instead of failing the batch (long-context evals send such prompts on purpose)."""
        def one(p):
            try:
                return self.complete(p, max_tokens=max_tokens, temperature=temperature, n=n, top_p=top_p, stop=stop,
                                     seed=seed, logprobs=logprobs, return_token_ids=return_token_ids)
            except APIStatusError as e:
                if skip_too_long and too_long(e):
                    return []
                raise

        return self._map(one, prompts)

    def chat_one(self, messages: list[dict[str, str]], *, max_tokens: int, temperature: float, n: int = 1,
                 top_p: float = 1.0, stop: list[str] | None = None, seed: int | None = None) -> list[Completion]:
        r = self.openai.chat.completions.create(model=self.settings.model, messages=messages, max_tokens=max_tokens,
                                                temperature=temperature, n=n, top_p=top_p, stop=stop or None,
                                                seed=seed)
        return _choices(r, lambda c: c.message.content or "")

    def chat(self, conversations: list[list[dict[str, str]]], max_tokens: int = 256, temperature: float = 1.0, *,
             n: int = 1, top_p: float = 1.0, stop: list[str] | None = None,
             seed: int | None = None) -> list[list[Completion]]:
        return self._map(lambda m: self.chat_one(m, max_tokens=max_tokens, temperature=temperature, n=n, top_p=top_p,
                                                 stop=stop, seed=seed), conversations)

    def _map(self, fn, items: list) -> list:
        if len(items) <= 1:
            return [fn(x) for x in items]
        with cf.ThreadPoolExecutor(max_workers=min(self.settings.concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        self.openai.close()
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def too_long(error: APIStatusError) -> bool:
    """The server refused the prompt as longer than its context: the embedded engine answers 413
    (``PromptTooLong``), vLLM 400 with "maximum context length" in the message."""
    return error.status_code == 413 or (error.status_code == 400 and "maximum context length" in str(error.message))


def _choices(response, text_of, logprobs_of=lambda c: None) -> list[Completion]:
    u = response.usage
    details = getattr(u, "prompt_tokens_details", None) if u else None
    cached = (getattr(details, "cached_tokens", None) or 0) if details else 0
    ordered = sorted(response.choices, key=lambda c: c.index)
    return [Completion(text_of(c), c.finish_reason, u.prompt_tokens if u else 0, u.completion_tokens if u else 0,
                       cached, getattr(c, "token_ids", None), getattr(c, "prompt_token_ids", None), logprobs_of(c))
            for c in ordered]


def trl_rollout_func(client: RolloutClient, *, max_tokens: int, temperature: float = 1.0, top_p: float = 1.0):
    """A ``rollout_func`` for TRL's ``GRPOTrainer`` (experimental TRL API) that samples through this client.

    For each prompt of the process's slice it asks for ``trainer.num_generations`` samples in one
    request (one prefill per group) and returns, per completion, the prompt and completion token
    ids and the sampled tokens' log-probabilities. Conversational prompts go through the served
    model's chat template. The server must serve the weights being trained: this does not sync
    weights (see the report/ARCHITECTURE note), so use it with a server that is reloaded per step,
    or for off-policy / eval-time rollouts.
    """

    def rollout(prompts: list, trainer) -> dict[str, list]:
        n = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        tok = trainer.processing_class
        texts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) if isinstance(p, list) else p
                 for p in prompts]
        groups = client.generate(texts, max_tokens, temperature, n=n, top_p=top_p, logprobs=True,
                                 return_token_ids=True)
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for group in groups:
            for c in group:
                if c.token_ids is None or c.logprobs is None:
                    raise RuntimeError("the rollout server returned no token ids/logprobs (needs return_token_ids)")
                out["prompt_ids"].append(c.prompt_token_ids)
                out["completion_ids"].append(c.token_ids)
                out["logprobs"].append(c.logprobs)
        return out

    return rollout


_default: RolloutClient | None = None
_default_lock = threading.Lock()


def default_client() -> RolloutClient:
    """The process-wide client built from the rollout settings (``TEMPER_ROLLOUT_*``; started on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = RolloutClient()
        return _default


def generate(prompts: list[str], max_tokens: int = 256, temperature: float = 1.0, *, n: int = 1, top_p: float = 1.0,
             stop: list[str] | None = None, seed: int | None = None,
             client: RolloutClient | None = None) -> list[list[Completion]]:
    """Completions for eval (``temperature=0``) and GRPO groups (``n=G``) from the configured backend."""
    return (client or default_client()).generate(prompts, max_tokens, temperature, n=n, top_p=top_p, stop=stop,
                                                 seed=seed)


def chat(conversations: list[list[dict[str, str]]], max_tokens: int = 256, temperature: float = 1.0, *, n: int = 1,
         top_p: float = 1.0, stop: list[str] | None = None, seed: int | None = None,
         client: RolloutClient | None = None) -> list[list[Completion]]:
    return (client or default_client()).chat(conversations, max_tokens, temperature, n=n, top_p=top_p, stop=stop,
                                             seed=seed)


class ChatPolicy:
    """A ``temper.agent.episodes.Policy`` served by the rollout backend.

    The episode is one chat: [system], user: instruction, then (assistant: action, user: observation)
    per turn, so every request extends the previous one and the server's prefix cache holds its
    history. The reply is the next command; an empty reply or ``stop_word`` ends the episode.
    """

    def __init__(self, client: RolloutClient | None = None, *, system_prompt: str | None = None,
                 max_tokens: int = 128, temperature: float = 0.0, stop_word: str = "DONE",
                 stop: list[str] | None = None) -> None:
        self.client, self.system_prompt = client, system_prompt
        self.max_tokens, self.temperature, self.stop_word, self.stop = max_tokens, temperature, stop_word, stop
        self.instruction: str | None = None

    def messages(self, observation: str, history: list) -> list[dict[str, str]]:
        if not history:
            self.instruction = observation
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        msgs.append({"role": "user", "content": self.instruction if self.instruction is not None else observation})
        for turn in history:
            msgs.append({"role": "assistant", "content": turn.action})
            msgs.append({"role": "user", "content": turn.observation})
        return msgs

    def __call__(self, observation: str, history: list) -> str | None:
        client = self.client or default_client()
        reply = client.chat_one(self.messages(observation, history), max_tokens=self.max_tokens,
                                temperature=self.temperature, stop=self.stop)[0].text.strip()
        return None if not reply or reply == self.stop_word else reply
