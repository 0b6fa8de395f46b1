"""Warm pool and scheduler: N prepared boxes shared by many concurrent executions.

Threads, not asyncio primitives, hold the state, so one pool serves every event loop of the
process (TRL's reward function calls ``asyncio.run`` once per batch) as well as plain threads.
Scheduling is FIFO through a private executor with one worker per box: a task waits in that
queue, takes an idle box, runs, hands its result back and then reclaims the box (work dir
wiped; its processes died with the run's PID namespace) before taking the next task. A task
whose deadline passes while it waits fails with ``QueueTimeout`` without running; the wall
limit of a task that starts late shrinks to what is left of its deadline. Submitting past
``max_queue`` waiting tasks fails at once with ``PoolFull`` (back-pressure, no silent pile-up).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures as cf
import contextlib
import os
import queue
import threading
import time
from collections.abc import Iterator, Mapping

from infra.sandbox.api import Backend, Box, Limits, Profile, Result, SandboxError, get_profile
from infra.sandbox.bwrap import BwrapBackend
from temper.core.settings import get_settings

_shared: dict[str, "SandboxPool"] = {}
_shared_lock = threading.Lock()
_backend_lock = threading.Lock()


class PoolFull(SandboxError):
    """More tasks are waiting than the pool's queue allows; retry later or raise max_queue."""


class QueueTimeout(SandboxError):
    """A task's deadline passed before a box was free; it never ran."""


_default: list[Backend] = []


def default_backend() -> Backend:
    """The process's backend, as the ``TEMPER_SANDBOX_BACKEND`` setting says (the flow's execution backend sets
    it for the jobs it starts): bubblewrap boxes here (one host directory for all, removed at exit), or
    sandbox pods in the cluster's sandbox namespace (``infra.sandbox.kubernetes``)."""
    with _backend_lock:
        if not _default:
            _default.append(_make_backend())
        return _default[0]


def _make_backend() -> Backend:
    if get_settings().sandbox_backend == "kubernetes":
        # lazy: the Kubernetes client (0.33 s) would load in every sandboxed verifier of a local run
        from infra.k8s.api import ClusterApi, load_config
        from infra.k8s.options import options_from_env
        from infra.sandbox.kubernetes import KubernetesBackend

        load_config()  # in-cluster (a training/eval pod's token), else the kubeconfig
        # in a job's pod: its boxes carry the job's name, and the launcher deletes what the job leaves behind
        return KubernetesBackend(ClusterApi(), options_from_env(), owner=get_settings().job.sandbox_owner)
    return BwrapBackend()


def request_argv(profile: Profile, command: list[str] | str | None, code: str | None) -> tuple[list[str], dict[str, str]]:
    """argv plus extra files for a request that is either a command or a code snippet."""
    if (command is None) == (code is None):
        raise SandboxError("give exactly one of command (argv or shell string) or code")
    if code is not None:
        return list(profile.code_argv), {profile.code_file: code}
    if isinstance(command, str):
        return ["bash", "-c", command], {}
    if not command:
        raise SandboxError("command is an empty argv")
    return list(command), {}


def run_in_box(box: Box, argv: list[str], files: Mapping[str, str | bytes], limits: Limits,
               stdin: bytes | None = None) -> Result:
    if files:
        box.write_files(files)
    return box.run(argv, limits, stdin=stdin)


class SandboxPool:
    """At most ``size`` concurrent executions over ``size + spare`` warm boxes of one profile.

    Use as a context manager or call ``close``. ``prewarm``: boxes start their next sandbox
    (for the python profile: an interpreter waiting for its program) as soon as they are free.
    """

    def __init__(self, profile: str | Profile = "python", size: int = 2, backend: Backend | None = None,
                 max_queue: int = 1024, prewarm: bool = True, spare: int | None = None) -> None:
        if size < 1:
            raise SandboxError(f"pool size must be >= 1, got {size}")
        self.profile = profile if isinstance(profile, Profile) else get_profile(profile)
        self.backend = backend or default_backend()
        self.size, self.max_queue, self.prewarm = size, max_queue, prewarm
        self._idle: queue.Queue[Box] = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        self._waiting: set[cf.Future] = set()
        self._boxes: set[Box] = set()  # every live box this pool made, idle or lent out: close() ends them all
        self.stats = {"runs": 0, "queue_timeouts": 0, "rejected": 0, "replaced": 0}
        self._executor = cf.ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"sandbox-{self.profile.name}")
        # Spare boxes warm up while others run, so a busy pool still hands out started sandboxes.
        self.spare = (size if prewarm else 0) if spare is None else spare
        for _ in range(size + self.spare):
            self._idle.put(self._ready(self._new_box()))

    # -- boxes -------------------------------------------------------------------------------------
    def acquire(self, timeout: float | None = None) -> Box:
        """An idle box for exclusive use (a Session); give it back with ``release``."""
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        try:
            return self._idle.get(timeout=timeout)
        except queue.Empty:
            raise QueueTimeout(f"no sandbox free within {timeout:.1f}s ({self.size} box(es), all busy)") from None

    def release(self, box: Box) -> None:
        """Reclaim (wipe) the box and make it available again; a broken box is replaced."""
        try:
            box.reset()
            ok = box.healthy()
        except OSError:
            ok = False
        if self._closed:
            self._end(box)
            return
        if not ok:
            self._end(box)
            self._count("replaced")
            box = self._new_box()
        self._idle.put(self._ready(box))

    def _new_box(self) -> Box:
        box = self.backend.create_box(self.profile)
        with self._lock:
            self._boxes.add(box)
        return box

    def _end(self, box: Box) -> None:
        with self._lock:
            self._boxes.discard(box)
        box.close()

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _ready(self, box: Box) -> Box:
        """Let the box start what it can ahead of its next run (optional backend hook ``warm``)."""
        warm = getattr(box, "warm", None) if self.prewarm else None
        if warm is not None:
            warm()
        return box

    @contextlib.contextmanager
    def lease(self, timeout: float | None = None) -> Iterator[Box]:
        box = self.acquire(timeout)
        try:
            yield box
        finally:
            self.release(box)

    # -- executions --------------------------------------------------------------------------------
    def submit(self, command: list[str] | str | None = None, code: str | None = None, *,
               files: Mapping[str, str | bytes] | None = None, limits: Limits | None = None,
               stdin: bytes | None = None, deadline_s: float | None = None) -> cf.Future:
        """Queue one execution; the future resolves to a Result (or QueueTimeout/SandboxError).

        ``deadline_s`` bounds queueing + running, counted from now (default: 4x the wall limit).
        """
        limits = limits or self.profile.limits
        argv, extra = request_argv(self.profile, command, code)
        all_files = {**(files or {}), **extra}
        deadline = time.monotonic() + (deadline_s if deadline_s is not None else 4 * limits.wall_s)
        with self._lock:
            if self._closed:
                raise SandboxError("sandbox pool is closed")
            if self._pending >= self.max_queue + self.size:
                self.stats["rejected"] += 1  # under self._lock already
                raise PoolFull(f"sandbox pool ({self.profile.name}) has {self._pending} tasks pending, "
                               f"max_queue={self.max_queue}")
            self._pending += 1
        result: cf.Future = cf.Future()
        self._waiting.add(result)
        result.add_done_callback(self._waiting.discard)
        self._executor.submit(self._work, result, argv, all_files, limits, stdin, deadline)
        return result

    def _work(self, fut: cf.Future, argv, files, limits: Limits, stdin, deadline: float) -> None:
        try:
            left = deadline - time.monotonic()
            if left <= 0:
                self._count("queue_timeouts")
                fut.set_exception(QueueTimeout("task deadline passed while it waited for a sandbox"))
                return
            try:
                box = self.acquire(timeout=left)
            except SandboxError as e:
                if isinstance(e, QueueTimeout):
                    self._count("queue_timeouts")
                fut.set_exception(e)
                return
            try:
                res = run_in_box(box, argv, files, limits.merged(wall_s=min(limits.wall_s, max(left, 0.05))), stdin)
                self._count("runs")
                fut.set_result(res)  # the caller has its answer before the reclaim below
            except BaseException as e:  # noqa: BLE001 - delivered to the caller, not swallowed
                fut.set_exception(e)
            finally:
                self.release(box)
        finally:
            with self._lock:
                self._pending -= 1

    def exec(self, command: list[str] | str | None = None, code: str | None = None, **kw) -> Result:
        return self.submit(command, code, **kw).result()

    async def aexec(self, command: list[str] | str | None = None, code: str | None = None, **kw) -> Result:
        return await asyncio.wrap_future(self.submit(command, code, **kw))

    @property
    def pending(self) -> int:
        return self._pending

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        for fut in list(self._waiting):  # tasks that never started: fail them rather than hang callers
            if not fut.done():
                fut.set_exception(SandboxError("sandbox pool closed before the task ran"))
        while True:
            try:
                self._end(self._idle.get_nowait())
            except queue.Empty:
                break
        # boxes still lent out (a Session not released, a reclaim the shutdown cancelled) end too: on a
        # cluster each is a pod, which would otherwise outlive the job (seen on the stand-in)
        with self._lock:
            lent, self._boxes = list(self._boxes), set()
        for box in lent:
            try:
                box.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown; a pod still dies at its deadline
                pass

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()




def shared_pool(profile: str, size: int | None = None) -> SandboxPool:
    """The process-wide pool of a profile (verifiers share it); created on first use."""
    with _shared_lock:
        pool = _shared.get(profile)
        if pool is None or pool._closed:
            pool = _shared[profile] = SandboxPool(profile, size=size or max(2, os.cpu_count() or 2))
        return pool


def close_shared() -> None:
    """Close every shared pool now (their boxes, e.g. sandbox pods, are deleted) and the default backend.

    Also registered at exit; a job calls it itself when it ends, because at interpreter exit the
    HTTP client a Kubernetes box needs to delete its pod may already be gone (seen on the stand-in:
    an eval pod's sandbox pods outlived it)."""
    _close_shared()


@atexit.register
def _close_shared() -> None:
    for pool in list(_shared.values()):
        pool.close()
    for backend in _default:
        getattr(backend, "close", lambda: None)()
