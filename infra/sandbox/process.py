"""Run one process tree to completion under a wall clock and an output cap, and say how it ended.

Shared by the bubblewrap backend and the bare-subprocess baseline. The process gets its own
session (so the whole group can be killed), stdout/stderr are read through a selector together
with a pidfd (so exit is noticed without polling), and resource usage comes from ``wait4``.
Classification of an exit into an ``Outcome`` lives here so every backend reports alike.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from infra.sandbox.api import Limits, Outcome, Result

# Last words of a program that ran out of address space (Python, glibc, C++, bash).
_MEMORY_TAIL = re.compile(rb"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory|xmalloc: cannot")
_FILE_TOO_LARGE = re.compile(rb"File too large|No space left on device")  # fsize rlimit, work dir quota
# Grace for the pipes to reach EOF once the main process has exited (orphans may hold them).
_DRAIN_S = 0.2
_PIPE_CAPACITY = 65536  # Linux default pipe buffer


def _kill_tree(proc: subprocess.Popen) -> None:
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
        try:
            kill()
        except ProcessLookupError:
            pass


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def spawn(argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
          user: int | None = None, group: int | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start argv in its own session with piped stdin/stdout/stderr; ``supervise`` takes it from here.

    Separate from supervise so a warm pool can start a sandbox before the work for it arrives.
    """
    return subprocess.Popen(
        list(argv), cwd=cwd, env=dict(env) if env is not None else None, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        pass_fds=tuple(pass_fds), user=user, group=group, extra_groups=[] if user is not None else None,
    )


def supervise(proc: subprocess.Popen, limits: Limits, stdin: bytes | None = None,
              signal_from_exit: bool = False, stop: Callable[[subprocess.Popen], bool] | None = None) -> Result:
    """Feed stdin, collect capped output until exit or deadline, kill the group, classify.

    The wall clock starts here. ``signal_from_exit``: the process is a supervisor (bwrap) that
    reports a child killed by signal N as exit status 128+N; read such statuses as that signal.
    ``stop``: how the backend ends a program that ran out of time or output before the group is
    killed, so that whatever accounts for its usage (GNU time in a bwrap box) still reports it;
    True when it killed the program (which then counts as killed by SIGKILL, as the group kill would).
    """
    start = time.monotonic()
    deadline = start + limits.wall_s
    if stdin and len(stdin) > _PIPE_CAPACITY:
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
    else:
        _feed(proc, stdin or b"")  # fits in the empty pipe: cannot block
    pidfd = os.pidfd_open(proc.pid)
    reason = None  # stays None when collect raises: no stop, just the group kill
    try:
        (out, err), total, reason = collect([proc.stdout.fileno(), proc.stderr.fileno()], pidfd, limits, deadline)
    finally:
        ended = time.monotonic()  # the run's wall clock ends here, not after the stop and the kill
        stopped = reason is not None and stop is not None and stop(proc)
        _kill_tree(proc)  # on success too: stragglers of the same group go with the main process
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    wall = ended - start
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if signal_from_exit and code is not None and 128 < code <= 128 + 64 and reason is None:
        code, sig = None, code - 128
    if stopped:
        code, sig = None, signal.SIGKILL
    return finish(out, err, total, reason, limits, wall, code, sig, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)


def collect(fds: Sequence[int], done_fd: int, limits: Limits, deadline: float) -> tuple[list[bytes], int, str | None]:
    """Read fds (capped at limits.output_bytes in total) until ``done_fd`` is readable and they
    reach EOF, the deadline passes ('timeout') or the cap is passed ('output_limit').

    ``done_fd`` says the program ended: a pidfd, or a fork server's status socket. Returns the
    kept bytes per fd, the number of bytes produced and the reason reading stopped early (or None).
    """
    bufs = {fd: bytearray() for fd in fds}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    sel.register(done_fd, selectors.EVENT_READ)
    total, reason, exited_at, pipes_open = 0, None, None, len(bufs)
    try:
        while reason is None:
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            if exited_at is not None and (pipes_open == 0 or now - exited_at > _DRAIN_S):
                break  # exited; output drained (or held open by stragglers, which the caller kills)
            wait = deadline - now if exited_at is None else min(deadline - now, _DRAIN_S)
            for key, _ in sel.select(wait):
                if key.fd == done_fd:
                    exited_at = time.monotonic()
                    sel.unregister(done_fd)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    pipes_open -= 1
                    continue
                keep = max(0, min(len(chunk), limits.output_bytes - total))
                bufs[key.fd] += chunk[:keep]
                total += len(chunk)
                if total > limits.output_bytes:
                    reason = "output_limit"
                    break
    finally:
        sel.close()
    return [bytes(b) for b in bufs.values()], total, reason


def finish(out: bytes, err: bytes, total: int, reason: str | None, limits: Limits, wall: float,
           code: int | None, sig: int | None, cpu_s: float, max_rss_kb: float) -> Result:
    """The Result of a run from what was collected and how the program ended, classified."""
    result = Result(
        stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"), exit_code=code, signal=sig,
        verdict=reason or "ok", wall_s=round(wall, 4), cpu_s=round(cpu_s, 4),
        max_rss_mb=round(max_rss_kb / 1024, 2), truncated=total > limits.output_bytes,
    )
    return classify(result, err)


def run_process(argv: Sequence[str], limits: Limits, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
                stdin: bytes | None = None, user: int | None = None, group: int | None = None,
                signal_from_exit: bool = False, pass_fds: Sequence[int] = ()) -> Result:
    """spawn + supervise: run argv under limits.wall_s and limits.output_bytes, say how it ended."""
    proc = spawn(argv, cwd=cwd, env=env, user=user, group=group, pass_fds=pass_fds)
    return supervise(proc, limits, stdin, signal_from_exit)


def classify(result: Result, stderr: bytes) -> Result:
    """Refine an 'ok' run from its signal and last words: CPU limit, file-size limit, memory, killed.

    The CPU limit (SIGXCPU at the soft RLIMIT_CPU) is its own verdict, not 'timeout': the wall clock
    did not run out, the program burnt its CPU seconds, and a user fixing one fixes the other.
    """
    if result.verdict != "ok":
        return result
    sig, tail = result.signal, stderr[-4096:]
    verdict: Outcome = "ok"
    if sig == signal.SIGXCPU:
        verdict = "cpu_limit"
    elif sig == signal.SIGXFSZ or (result.exit_code and _FILE_TOO_LARGE.search(tail)):
        verdict = "output_limit"
    elif result.exit_code and _MEMORY_TAIL.search(tail):
        verdict = "memory"
    elif sig is not None:
        verdict = "memory" if sig == signal.SIGSEGV and _MEMORY_TAIL.search(tail) else "killed"
    return result.model_copy(update={"verdict": verdict})
