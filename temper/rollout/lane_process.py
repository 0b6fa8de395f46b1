"""A lane served by its own engine process: by default the long lane, so long prompts never share a core,
a forward or the GIL with the short ones.

Why a process: on a CPU, prefill is compute-bound, so a long chunk costs as much inside a shared forward
as alone: with long prompts in the engine's forwards every long token lengthens the short requests'
forwards, and the long stream only gets the time the short ones leave idle. Short latency and long
throughput cannot both hold on one core (measured in ``benchmarks/mixed_load.py``). A thread would not
separate them: the engine's forwards are many small torch ops whose Python glue holds the GIL (two
threads of them slowed each other ~1.3-1.4x in a probe; two processes ~1.0-1.07x). Decode belongs
with the prefill: a long request's decode row reads its whole KV every step (16 MB at 4k tokens of
the benchmark's model), and an earlier version that only prefilled elsewhere and decoded in the
engine's forwards still slowed the short requests by 1.14-1.33x. Production serving splits traffic
the same way, routing by length to separate replicas.

The process runs a plain ``Engine`` over the lane alone (its own scheduler, chunked prefill and prefix
cache: requests of one lane share documents with each other, and a short prompt cannot hold a long
one's document), loading its own copy of the weights from ``model_dir``; so it serves engines that
loaded their model from there, never a live policy whose weights change between steps (the engine
checks). What crosses the boundary: the prompt and its sampling parameters in, the request's
``Delta``/``Finished`` events out. Nothing here knows lanes or sampling.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

import torch.multiprocessing as tmp

from temper.rollout.config import EngineConfig
from temper.rollout.requests import EngineRequest, Event, Finished

log = logging.getLogger(__name__)

# The process's CPU priority below the engine's: when the cores are oversubscribed (the engine's and this
# process's threads, the server's own, other processes) the short requests' forwards get the CPU first.
NICE = 10


def usable_cpus() -> float:
    """CPUs this process may use: its affinity, capped by a cgroup v2 quota (a Kubernetes CPU limit)."""
    cpus = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cpus


def serve(engine_class: type, config_json: str, inbox, outbox, prefilled) -> None:
    """The process: an ``engine_class`` (the ``Engine`` that started it: passed, not imported, as the engine
    imports this module) over one lane, stepped between reads of the inbox.

    In: ``("submit", id, prompt, params)``, ``("cancel", id)``, ``("stop",)``. Out: ``(id, event)``, the
    engine's ``Delta`` and ``Finished`` events of request ``id`` (the sender's id, not this engine's).
    ``prefilled`` (a shared integer) counts the prompt tokens it has prefilled, updated after every step
    and before each ``Finished``: progress without a message per chunk.
    """
    os.nice(NICE)
    engine = engine_class(EngineConfig.model_validate_json(config_json))
    running: dict[str, EngineRequest] = {}
    counted = [0]

    def count_prefilled() -> None:
        prefilled.value += engine.counters["prefill_tokens"] - counted[0]
        counted[0] = engine.counters["prefill_tokens"]

    def sink_for(rid: str) -> Callable[[Event], None]:
        def sink(ev: Event) -> None:
            if isinstance(ev, Finished):
                running.pop(rid, None)
                count_prefilled()  # before the request's end is known: its prompt is in the count
            outbox.put((rid, ev))
        return sink

    parent = os.getppid()
    while True:
        try:
            msg = inbox.get(timeout=1.0) if not engine.scheduler.has_work else inbox.get_nowait()
        except queue.Empty:
            if os.getppid() != parent:
                return  # the engine's process is gone (killed): nothing would read what this computes
            if engine.scheduler.has_work:
                if engine.step() == 0:
                    time.sleep(0.002)  # nothing could run this step (cannot happen today): do not spin a core
                count_prefilled()
            continue
        if msg[0] == "stop":
            engine.close()
            return
        if msg[0] == "cancel":
            if msg[1] in running:
                engine.cancel(running[msg[1]])
            continue
        _, rid, prompt, params = msg
        try:
            running[rid] = engine.submit([prompt], params, [sink_for(rid)])[0]
        except Exception as e:  # PromptTooLong, QueueFull, a bad token id: that request fails, not the process
            outbox.put((rid, Finished(rid, len(prompt), 0, 0, f"{type(e).__name__}: {e}")))


class LaneProcess:
    """The engine's side: starts the process on first use, forwards requests, collects their events.

    ``held`` is every request a process has and has not finished, with that process. ``on_event(req,
    event)`` is called on the reader thread; when a process dies, each request it held gets a
    ``Finished`` with the error.
    ``prefilled_tokens`` is every prompt token its processes have prefilled so far, finished or not.
    """

    def __init__(self, engine_class: type, config: EngineConfig, lane: str, threads: int,
                 on_event: Callable[[EngineRequest, Event], None]) -> None:
        self.engine_class = engine_class
        only = next(lc for lc in config.lanes if lc.name == lane).model_copy(update={"own_process": False})
        self.config_json = config.model_copy(update={"lanes": [only], "torch_threads": threads}).model_dump_json()
        self.on_event = on_event
        self.held: dict[str, tuple[EngineRequest, object]] = {}  # id -> (request, the process that has it)
        self._ctx = tmp.get_context("spawn")  # fork would copy the engine's threads and locks mid-use
        self._proc = None
        self._inbox = None
        self._prefilled = self._ctx.Value("q", 0, lock=False)  # written by the process alone
        self._lock = threading.Lock()
        self._closed = False
        self.starts = 0

    @property
    def pid(self) -> int | None:
        proc = self._proc  # (read once: the reader thread may clear it)
        return proc.pid if proc is not None else None

    @property
    def prefilled_tokens(self) -> int:
        return self._prefilled.value

    def submit(self, req: EngineRequest) -> None:
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            self.held[req.id] = (req, self._proc)
            self._inbox.put(("submit", req.id, req.prompt, req.params))

    def forget(self, req: EngineRequest) -> None:
        """``req`` ended here first (cancelled, shut down): the process drops it; its late events are ignored."""
        with self._lock:
            if self.held.pop(req.id, None) is not None and self._proc is not None:
                self._inbox.put(("cancel", req.id))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, inbox = self._proc, self._inbox
            self._proc = None  # what it held is the engine's to end now (its close fails them)
        if proc is None:
            return
        if proc.is_alive():
            inbox.put(("stop",))
            proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)

    def _start(self) -> None:
        """(lock held) A new process, and a reader thread that outlives it only to report its death."""
        self._inbox, outbox = self._ctx.Queue(), self._ctx.Queue()
        self._proc = self._ctx.Process(target=serve, name="temper-lane", daemon=True,
                                       args=(self.engine_class, self.config_json, self._inbox, outbox,
                                             self._prefilled))
        self._proc.start()
        self.starts += 1
        threading.Thread(target=self._read, args=(self._proc, outbox), name="lane-reader", daemon=True).start()

    def _read(self, proc, outbox) -> None:
        while True:
            try:
                rid, ev = outbox.get(timeout=0.5)
            except Exception as e:  # Empty, or a message cut short by the process's death
                if not isinstance(e, queue.Empty):
                    log.warning("lane process %s: unreadable message (%s)", proc.pid, e)
                if proc.is_alive():
                    continue
                self._died(proc)
                return
            with self._lock:
                entry = self.held.get(rid) if not isinstance(ev, Finished) else self.held.pop(rid, None)
            if entry is not None:  # else ended here meanwhile
                self.on_event(entry[0], ev)

    def _died(self, proc) -> None:
        with self._lock:
            lost = [req for req, owner in self.held.values() if owner is proc]
            for req in lost:
                del self.held[req.id]
            if self._proc is proc:
                self._proc = None
            closed = self._closed
        if closed:
            return
        error = f"lane process (pid {proc.pid}) exited with code {proc.exitcode} before finishing this request"
        log.warning("lane process %s exited with code %s; %d request(s) lost", proc.pid, proc.exitcode, len(lost))
        for req in lost:
            self.on_event(req, Finished(req.id, len(req.prompt), 0, 0, error))
