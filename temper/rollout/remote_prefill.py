"""The engine's side of disaggregated prefill (``prefill_worker.py`` runs the process): which requests the
worker holds, and what becomes of what it reports.

Threading: ``start``, ``take`` and ``forget`` run with the engine's lock held, on the engine's thread;
``_on_message`` runs on the worker's reader thread. A finished prompt's KV goes into the prefix cache on
that reader thread (a copy of the whole prompt: 9-17 ms at 4k tokens of the benchmark's model), so it
does not stall the engine's forwards; its cache itself is the shared buffer, not a copy.
"""

from __future__ import annotations

import logging
from collections import deque

from temper.rollout.kv_cache import PrefixMatch, cache_over, kv_buffer, kv_buffer_bytes
from temper.rollout.prefill_worker import PrefillWorker, shm_free_bytes
from temper.rollout.requests import EngineRequest

log = logging.getLogger(__name__)


class RemotePrefills:
    def __init__(self, engine) -> None:
        c = engine.config
        self.engine = engine
        self.worker = PrefillWorker(c.model_dir, c.dtype, c.prefill_process_threads, self._on_message)
        self.held: dict[str, EngineRequest] = {}  # requests whose prompt the worker holds, by id
        self.messages: deque[tuple] = deque()

    def start(self, req: EngineRequest, hit: PrefixMatch | None, capacity: int, chunk: int) -> bool:
        """Send ``req``'s prompt (after the prefix-cache ``hit``, whose KV goes along) to the worker, its KV to
        go into a shared buffer of ``capacity`` positions. False, and nothing sent, when that buffer would not
        fit twice in /dev/shm (a pod's is its shm_size): then the engine prefills it itself."""
        model = self.engine.model
        need, free = kv_buffer_bytes(model.config, capacity, model.dtype), shm_free_bytes()
        if 2 * need > free:  # room for it and one more, or the next long request fails in the worker
            log.warning("request %s: its KV buffer (%d MB) does not fit twice in /dev/shm (%d MB free); prefilled "
                        "in the engine instead of the prefill worker (raise the shm size, e.g. a pod's shm_size)",
                        req.id, need >> 20, free >> 20)
            return False
        buffer = None
        if hit is not None and hit.length:
            buffer = kv_buffer(model.config, capacity, model.dtype)
            for i, (k, v) in enumerate(hit.kv):
                buffer[i, 0, ..., :hit.length, :] = k
                buffer[i, 1, ..., :hit.length, :] = v
        self.worker.submit(req.id, req.prompt, hit.length if hit else 0, buffer, capacity, chunk)
        self.held[req.id] = req
        req.remote_prefill = True
        return True

    def forget(self, req: EngineRequest) -> None:
        """``req`` ends before its prompt came back (cancelled, failed, shut down): the worker drops it."""
        if req.remote_prefill:
            self.worker.cancel(req.id)
            self.held.pop(req.id, None)
            req.remote_prefill = False

    def _on_message(self, msg: tuple) -> None:
        e = self.engine
        req = self.held.get(msg[1])
        if msg[0] == "done" and req is not None and e.prefix_cache is not None:
            n = len(req.prompt)
            e.prefix_cache.insert(req.prompt, [(layer[0][..., :n, :], layer[1][..., :n, :]) for layer in msg[2]])
        with e._lock:
            self.messages.append(msg)
            e._wake.notify_all()

    def take(self) -> None:
        """Progress, finished prompts (the KV buffer becomes the request's cache; it decodes from this step's
        forward on) and failures, as the worker reported them since the last step."""
        e = self.engine
        while self.messages:
            kind, rid, *rest = self.messages.popleft()
            req = self.held.get(rid) if kind == "progress" else self.held.pop(rid, None)
            if req is None or req.state != "prefill":
                continue  # ended meanwhile (cancelled, engine shut down)
            if kind == "error":
                req.remote_prefill = False
                e.counters["errors"] += 1
                e._finish(req, error=rest[0])
                continue
            done = rest[0] if kind == "progress" else len(req.prompt)
            e.counters["prefill_tokens"] += done - req.prefilled
            e.counters["worker_prefill_tokens"] += done - req.prefilled
            e._log(req, "prefill", done - req.prefilled, f"{done}/{len(req.prompt)} (worker)")
            req.prefilled = done
            if kind == "done":
                buffer, logits = rest
                req.remote_prefill = False
                req.cache = cache_over(buffer, len(req.prompt), e.model.config)
                try:
                    e._prefilled(req, logits, cached=True)
                except Exception as err:
                    e._failed(req, err)
                    continue
                e._finish_if_done(req)

    def stats(self) -> dict[str, int | None]:
        return {"pid": self.worker.pid, "starts": self.worker.starts, "held": len(self.held)}

    def close(self) -> None:
        self.worker.close()
