"""Disaggregated prefill: a worker process that prefills one lane's prompts on its own CPU core and hands
the finished KV back to the engine, which decodes them in its mixed forwards.

Why a process: on a CPU a prefill chunk costs as much inside a shared forward as alone (prefill is
compute-bound), so when long prompts are prefilled in the engine's forwards every long token
lengthens the short requests' forwards, and the long stream can only have the time the short ones
leave idle: short latency and long throughput cannot both hold on one core (measured in
``benchmarks/mixed_load.py``). Giving the long lane's prefill its own core separates them, as
disaggregated prefill does on GPUs (DistServe, Splitwise, vLLM's disaggregated prefilling). A thread
would not: the engine's forwards are many small torch ops whose Python glue holds the GIL, and two
threads of them slowed each other by ~1.3-1.4x in a probe; two processes by ~1.0-1.07x.

What crosses the process boundary: the prompt, the prefix-cache hit's KV (so a shared document is
still computed once: the engine's prefix cache stays the one cache), progress after each chunk, and
the prompt's KV plus the last position's logits when done. The KV lives in one shared-memory buffer
(``kv_buffer``) with room for the completion, which the worker fills and the engine then decodes into
(``cache_over``): nothing is copied on either side (``torch.multiprocessing`` passes its descriptor).
A copy in the engine's thread would stall every short request: 9-17 ms for a 4k prompt of the
benchmark's model, measured. The worker loads its own copy of the weights from ``model_dir``, so it
serves engines that loaded their model from there, never a live policy whose weights change between
steps (the engine checks).

This module is the process and its client (plain torch + transformers; nothing of lanes or sampling);
``remote_prefill.py`` is the engine's bookkeeping of the prompts the worker holds.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.multiprocessing as tmp

from temper.rollout.kv_cache import cache_over, kv_buffer
from temper.rollout.mixed import Segment, mixed_forward

log = logging.getLogger(__name__)


# The worker's CPU priority below the engine's: when the cores are oversubscribed (the engine's and the
# worker's threads, the server's own, other processes), the short requests' forwards get the CPU first
# and the long prompts take what is left, instead of the two slowing each other equally.
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


def shm_free_bytes() -> int:
    """Room left in /dev/shm, where the KV buffers live (a pod's is its ``shm_size`` emptyDir)."""
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return 0


@dataclass
class _Job:
    request_id: str
    prompt: list[int]
    done: int  # prompt tokens whose KV the cache holds
    chunk: int
    buffer: torch.Tensor  # kv_buffer: the prompt's KV and room for the completion
    cache: object


def serve(model_dir: str, dtype: str, threads: int, inbox, outbox) -> None:
    """The worker process: prefill jobs FIFO, one chunk per iteration, reading new messages between chunks.

    Messages in: ``("prefill", id, prompt, start, buffer | None, capacity, chunk)`` (``buffer``: a ``kv_buffer``
    holding the first ``start`` positions, or None to allocate one of ``capacity``), ``("cancel", id)``,
    ``("stop",)``. Out: ``("progress", id, done)``, ``("done", id, buffer, logits [1, vocab])``,
    ``("error", id, text)``.
    """
    # lazy: transformers (800 ms) is only needed in the worker process; the engine imports this module
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    os.nice(NICE)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    jobs: deque[_Job] = deque()

    def handle(msg) -> bool:
        if msg[0] == "stop":
            return False
        if msg[0] == "cancel":
            for job in [j for j in jobs if j.request_id == msg[1]]:
                jobs.remove(job)
        else:
            _, rid, prompt, start, buffer, capacity, chunk = msg
            if buffer is None:
                buffer = kv_buffer(model.config, capacity, model.dtype)
            jobs.append(_Job(rid, prompt, start, chunk, buffer, cache_over(buffer, start, model.config)))
        return True

    parent = os.getppid()
    while True:
        try:
            msg = inbox.get(timeout=1.0) if not jobs else inbox.get_nowait()
        except queue.Empty:
            if os.getppid() != parent:
                return  # the engine's process is gone (killed): nothing will read what this computes
            msg = None
            if not jobs:
                continue
        if msg is not None:
            if not handle(msg):
                return
            continue  # read everything waiting before the next chunk (a cancel must not wait a chunk)
        job = jobs[0]
        try:
            lo = job.done
            hi = min(len(job.prompt), lo + job.chunk)
            logits = mixed_forward(model, [Segment(job.cache, [job.prompt[lo:hi]], lo, want_logits=hi == len(job.prompt))])
            job.done = hi
            if hi < len(job.prompt):
                outbox.put(("progress", job.request_id, hi))
                continue
            jobs.popleft()
            outbox.put(("done", job.request_id, job.buffer, logits[0]))
        except Exception as e:  # one bad job must not take the worker down
            jobs.popleft()
            outbox.put(("error", job.request_id, f"{type(e).__name__}: {e}"))


class PrefillWorker:
    """The engine's side: starts the process on first use, sends jobs, collects what comes back.

    ``on_message`` is called on the worker's reader thread for every message (the engine queues them and
    wakes its loop); when the process dies, every job it held is reported as an ``error``.
    """

    def __init__(self, model_dir: Path, dtype: str, threads: int, on_message: Callable[[tuple], None]) -> None:
        self.model_dir, self.dtype, self.threads = str(model_dir), dtype, threads
        self.on_message = on_message
        self._ctx = tmp.get_context("spawn")  # fork would copy the engine's threads and locks mid-use
        self._proc = None
        self._inbox = self._outbox = None
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def submit(self, request_id: str, prompt: list[int], start: int, buffer: torch.Tensor | None, capacity: int,
               chunk: int) -> None:
        """Prefill ``prompt`` from position ``start`` (``buffer`` holds the KV before it; None when 0) into a
        ``kv_buffer`` of ``capacity`` positions, ``chunk`` tokens per forward."""
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            self._pending.add(request_id)
            self._inbox.put(("prefill", request_id, prompt, start, buffer, capacity, chunk))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._pending and self._proc is not None:
                self._pending.discard(request_id)
                self._inbox.put(("cancel", request_id))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, inbox = self._proc, self._inbox
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
        self._inbox, self._outbox = self._ctx.Queue(), self._ctx.Queue()
        self._proc = self._ctx.Process(target=serve, name="temper-prefill",
                                       args=(self.model_dir, self.dtype, self.threads, self._inbox, self._outbox),
                                       daemon=True)
        self._proc.start()
        self.starts += 1
        threading.Thread(target=self._read, args=(self._proc, self._outbox), name="prefill-reader",
                         daemon=True).start()

    def _read(self, proc, outbox) -> None:
        while True:
            try:
                msg = outbox.get(timeout=0.5)
            except Exception as e:
                if not isinstance(e, queue.Empty) and not self._closed:
                    # a result whose shared memory went with its process (it died, or was stopped, right
                    # after sending): its job is still pending and is reported lost below
                    log.warning("prefill worker %s: unreadable message (%s)", proc.pid, e)
                if proc.is_alive():
                    continue
                with self._lock:
                    lost = sorted(self._pending) if self._proc is proc else []
                    if self._proc is proc:
                        self._pending.clear()
                        self._proc = None
                    closed = self._closed
                if not closed:
                    log.warning("prefill worker %s exited with code %s; %d job(s) lost", proc.pid, proc.exitcode,
                                len(lost))
                for rid in lost:
                    self.on_message(("error", rid, f"prefill worker (pid {proc.pid}) exited with code "
                                                   f"{proc.exitcode} before finishing this prompt"))
                return
            if msg[0] in ("done", "error"):
                with self._lock:
                    if msg[1] not in self._pending:
                        continue  # cancelled meanwhile
                    self._pending.discard(msg[1])
            self.on_message(msg)
