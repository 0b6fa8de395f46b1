"""OpenAI-compatible HTTP front of the engine (FastAPI): /v1/completions, /v1/chat/completions (with SSE
streaming), /v1/models, /health, /metrics. ``EmbeddedServer`` runs it under uvicorn in a thread.

The HTTP layer only translates: it tokenizes, hands the prompts to ``Engine.submit`` (which admits
all of a request's prompts or none), and turns the engine's per-sample deltas into OpenAI choices.
Admission failures map to 413 (prompt over the lane's budget or the context) and 429 (lane queue
full, with Retry-After); the JSON body names the limit. A client that disconnects mid-stream
cancels its engine requests. For GRPO, ``logprobs=0`` (chat: ``logprobs=true``) returns each sampled
token's log-probability and vLLM's ``return_token_ids`` extension returns prompt and completion ids.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from temper.rollout.engine import Delta, Engine, Event, Finished
from temper.rollout.errors import AdmissionError
from temper.rollout.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    UnsupportedField,
    completion_body,
    error_body,
    new_id,
    usage,
)


class _Run:
    """The engine requests behind one HTTP request, and an asyncio queue of their events."""

    def __init__(self, engine: Engine, prompts: list[list[int]], params, loop: asyncio.AbstractEventLoop) -> None:
        self.engine, self.n, self.loop = engine, params.n, loop
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.reqs = engine.submit(prompts, params, [self._sink(i) for i in range(len(prompts))])

    def _sink(self, prompt_index: int):
        def sink(ev: Event) -> None:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (prompt_index, ev))
            except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
                pass
        return sink

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        remaining = len(self.reqs)
        while remaining:
            prompt_index, ev = await self.queue.get()
            if isinstance(ev, Finished):
                remaining -= 1
            yield prompt_index, ev

    def cancel(self) -> None:
        for r in self.reqs:
            if r.state != "done":
                self.engine.cancel(r)


def create_app(engine: Engine) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.close()

    app = FastAPI(title="temper rollout engine", lifespan=lifespan)
    model_name = engine.config.served_model_name

    @app.exception_handler(AdmissionError)
    async def _admission(request: Request, exc: AdmissionError):
        headers = {"Retry-After": "1"} if exc.status_code == 429 else None
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"] if p != "body")
        return JSONResponse(error_body(f"{loc}: {first['msg']}", "invalid_request_error", 400, loc), status_code=400)

    @app.exception_handler(ValidationError)
    async def _bad_params(request: Request, exc: ValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return JSONResponse(error_body(f"{loc}: {first['msg']}", "invalid_request_error", 400, loc), status_code=400)

    @app.exception_handler(UnsupportedField)
    async def _unsupported(request: Request, exc: UnsupportedField):
        return JSONResponse(error_body(str(exc), "invalid_request_error", 400, exc.field), status_code=400)

    def check_model(name: str) -> JSONResponse | None:
        if name != model_name:
            return JSONResponse(error_body(f"model '{name}' is not served here (serving '{model_name}')",
                                           "model_not_found", 404, "model"), status_code=404)
        return None

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return engine.stats()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "temper",
                                            "max_model_len": engine.context}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if (bad := check_model(body.model)) is not None:
            return bad
        params = body.sampling()
        prompts = [engine.encode(p) if isinstance(p, str) else p for p in body.prompts()]
        return await respond(request, body, prompts, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        if (bad := check_model(body.model)) is not None:
            return bad
        prompt = engine.encode_chat(body.plain_messages())
        params = body.sampling(default_max_tokens=max(1, engine.context - len(prompt)))
        return await respond(request, body, [prompt], params, chat=True)

    async def respond(request: Request, body, prompts: list[list[int]], params, chat: bool):
        try:
            run = _Run(engine, prompts, params, asyncio.get_running_loop())
        except ValueError as e:  # empty prompt, token ids outside the vocabulary, logprobs in the fast profile
            return JSONResponse(error_body(str(e), "invalid_request_error", 400, "prompt"), 400)
        rid = new_id("chatcmpl" if chat else "cmpl")
        shape = _ChoiceShape(engine, chat, params.logprobs, body.return_token_ids, prompts, run.n)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(stream(run, rid, shape, include_usage), media_type="text/event-stream")
        texts: dict[int, list[str]] = {}
        ids: dict[int, list[int]] = {}
        lps: dict[int, list[float]] = {}
        finish: dict[int, str | None] = {}
        totals = [0, 0, 0]
        async for pi, ev in run.events():
            if isinstance(ev, Delta):
                idx = pi * run.n + ev.index
                texts.setdefault(idx, []).append(ev.text)
                ids.setdefault(idx, []).extend(ev.token_ids)
                lps.setdefault(idx, []).extend(ev.logprobs or [])
                if ev.finish_reason:
                    finish[idx] = ev.finish_reason
            else:
                if ev.error:
                    run.cancel()
                    return JSONResponse(error_body(f"generation failed: {ev.error}", "server_error", 500), 500)
                totals[0] += ev.prompt_tokens
                totals[1] += ev.completion_tokens
                totals[2] += ev.cached_tokens
        choices = [shape.full(idx, "".join(texts.get(idx, [])), ids.get(idx, []), lps.get(idx, []),
                              finish.get(idx, "length")) for idx in range(len(prompts) * run.n)]
        kind = "chat.completion" if chat else "text_completion"
        return completion_body(rid, model_name, choices, usage(*totals), kind)

    async def stream(run: _Run, rid: str, shape: _ChoiceShape, include_usage: bool) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if shape.chat else "text_completion"
        totals = [0, 0, 0]
        try:
            if shape.chat:
                for idx in range(len(run.reqs) * run.n):
                    yield _sse(completion_body(rid, model_name, [{"index": idx, "delta": {"role": "assistant",
                                                                  "content": ""}, "finish_reason": None,
                                                                  "logprobs": None}], None, kind))
            async for pi, ev in run.events():
                if isinstance(ev, Delta):
                    idx = pi * run.n + ev.index
                    choice = shape.delta(idx, ev.text, ev.token_ids, ev.logprobs or [], ev.finish_reason)
                    yield _sse(completion_body(rid, model_name, [choice], None, kind))
                else:
                    if ev.error:
                        yield _sse(error_body(f"generation failed: {ev.error}", "server_error", 500))
                        return
                    totals[0] += ev.prompt_tokens
                    totals[1] += ev.completion_tokens
                    totals[2] += ev.cached_tokens
            if include_usage:
                yield _sse(completion_body(rid, model_name, [], usage(*totals), kind))
            yield "data: [DONE]\n\n"
        finally:
            run.cancel()  # no-op when everything finished; stops work when the client went away

    return app


class _ChoiceShape:
    """How one choice looks on the wire: completion or chat, with optional logprobs and token ids."""

    def __init__(self, engine: Engine, chat: bool, logprobs: bool, token_ids: bool, prompts: list[list[int]],
                 n: int) -> None:
        self.engine, self.chat, self.logprobs, self.token_ids = engine, chat, logprobs, token_ids
        self.prompts, self.n = prompts, n

    def _logprobs(self, ids: list[int], lps: list[float]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        toks = self.engine.tokenizer.convert_ids_to_tokens(ids)
        if self.chat:
            return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                for t, lp in zip(toks, lps)]}
        offsets, at = [], 0
        for t in toks:
            offsets.append(at)
            at += len(t)
        return {"tokens": toks, "token_logprobs": lps, "top_logprobs": None, "text_offset": offsets}

    def _ids(self, choice: dict[str, Any], idx: int, ids: list[int]) -> dict[str, Any]:
        if self.token_ids:
            choice["prompt_token_ids"] = self.prompts[idx // self.n]
            choice["token_ids"] = ids
        return choice

    def full(self, idx: int, text: str, ids: list[int], lps: list[float], reason: str | None) -> dict[str, Any]:
        body = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        return self._ids({"index": idx, **body, "finish_reason": reason, "logprobs": self._logprobs(ids, lps)},
                         idx, ids)

    def delta(self, idx: int, text: str, ids: list[int], lps: list[float], reason: str | None) -> dict[str, Any]:
        body = {"delta": {"content": text} if text else {}} if self.chat else {"text": text}
        return self._ids({"index": idx, **body, "finish_reason": reason, "logprobs": self._logprobs(ids, lps)},
                         idx, ids)


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class EmbeddedServer:
    """uvicorn serving ``create_app(engine)`` on a thread; ``with EmbeddedServer(engine) as url`` gives
    the ``http://host:port/v1`` base URL. The socket is bound before the thread starts, so the port is
    known (and ours) without a race; ``port=0`` picks a free one."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.engine, self.host, self.port, self.log_level = engine, host, port, log_level
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> str:
        # lazy: uvicorn (100 ms) would load whenever temper.rollout.client is imported
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(create_app(self.engine), log_level=self.log_level, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="rollout-http")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"embedded rollout server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._server = self._thread = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
