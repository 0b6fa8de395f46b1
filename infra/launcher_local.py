"""Run a JobSpec as local processes: ``accelerate launch`` for distributed jobs, else the command.

Output (stdout and stderr merged) is streamed line by line to a callback. The job runs in
its own process group (session), so cancel or timeout kills every rank and every child
they started, not just the launcher. On a CPU host the job's Python processes are forks of a
pre-imported process (``job_zygote.py``; settings ``preimported_jobs``): a small job starts in
milliseconds instead of ~10 s of imports, and killing the group still ends every one of them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from infra.job_zygote import CLIENT, socket_for
from infra.job_zygote import enabled as zygote_enabled
from infra.jobspec import JobSpec
from temper.core.settings import get_settings

TIMEOUT_EXIT = 124
CANCEL_EXIT = 130


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_argv(spec: JobSpec, zygote: str | None = None) -> list[str]:
    """The argv that runs ``spec`` here; distributed jobs go through accelerate launch. With a ``zygote`` socket,
    every ``python -m`` of it (the job, the launcher and each rank) is a fork of that pre-imported process
    (``job_zygote.py``)."""
    cmd = list(spec.command)
    via = [sys.executable, CLIENT, zygote] if zygote else [sys.executable]
    if not spec.distributed:
        return [*via, *cmd[1:]] if zygote and cmd[:1] == [sys.executable] and cmd[1:2] == ["-m"] else cmd
    if cmd and os.path.basename(cmd[0]).startswith("python"):
        cmd = cmd[1:]
    launch = [*via, "-m", "accelerate.commands.launch", "--num_processes", str(spec.world_size),
              "--num_machines", "1", "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port())]
    if spec.accelerate_config:
        launch += ["--config_file", spec.accelerate_config]
    if cmd and cmd[0] == "-m":  # each rank: `python -u CLIENT SOCKET -m MODULE ARGS` (accelerate runs a script so)
        return launch + ([CLIENT, zygote, *cmd] if zygote else ["--module", *cmd[1:]])
    return launch + cmd


def _kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # also children that outlived the leader
    except ProcessLookupError:
        pass
    proc.wait()


def job_error(lines: list[str]) -> str | None:
    """The workload's own one-line error (``temper: error: ...``, printed by workloads/*), if any: it
    says what went wrong, where the launcher's tail would show torchrun's traceback of the agent."""
    return next((line.removeprefix("temper: error: ") for line in lines if line.startswith("temper: error: ")), None)


def _start_ticks(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, what identifies it across pid reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_leftover(claim: Path, on_line: Callable[[str], None] = print, grace_s: float = 10.0) -> bool:
    """Kill the process group recorded in ``claim`` if it still runs: the job a dead caller left behind.

    A job runs in its own session so that cancelling it kills every rank; the other side of that is
    that when the process that started it is SIGKILLed, the job runs on, orphaned, still writing its
    checkpoints. The next attempt of the same job (same name) must stop it before starting again.
    The group is the one recorded only if its leader is gone (Linux never reuses a pid that is
    still a process group's id) or still has the recorded start time. Returns whether one was stopped.
    """
    try:
        pgid_text, ticks = claim.read_text().split()
        pgid = int(pgid_text)
    except (OSError, ValueError):
        return False
    now = _start_ticks(pgid)
    if not _group_alive(pgid) or (now is not None and now != ticks):
        claim.unlink(missing_ok=True)
        return False
    on_line(f"launcher: stopping process group {pgid}, left running by an earlier attempt of this job")
    deadline = time.monotonic() + grace_s
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_alive(pgid):
            break
        deadline = time.monotonic() + grace_s
    claim.unlink(missing_ok=True)
    return True


def run_job(spec: JobSpec, on_line: Callable[[str], None] = print, *, cwd: str | None = None,
            cancel: threading.Event | None = None, claim: Path | None = None) -> int:
    """Run to completion; returns the exit status (124 on timeout, 130 when cancelled).

    ``on_line`` may set ``cancel`` itself (e.g. to stop a job when a line appears).
    ``claim``: a file naming the job's process group while it runs; a group an earlier attempt
    recorded there and left running (its caller died) is stopped first (``stop_leftover``).
    """
    if claim is not None:
        stop_leftover(claim, on_line)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
    zygote = socket_for(env) if get_settings().preimported_jobs and zygote_enabled() else None
    proc = subprocess.Popen(build_argv(spec, zygote), cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1,
                            start_new_session=True)
    if claim is not None:
        claim.parent.mkdir(parents=True, exist_ok=True)
        claim.write_text(f"{proc.pid} {_start_ticks(proc.pid)}")
    cancel = cancel or threading.Event()
    done = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        done.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = time.monotonic() + spec.timeout_s
    status: int | None = None
    while proc.poll() is None:
        if cancel.is_set():
            status = CANCEL_EXIT
            break
        if time.monotonic() > deadline:
            status = TIMEOUT_EXIT
            on_line(f"launcher: job {spec.name} timed out after {spec.timeout_s:.0f}s; killing its process group")
            break
        time.sleep(0.1)
    if status is not None:
        _kill_group(proc)
    else:
        # ranks may still hold the pipe open after the leader exited
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    done.wait(timeout=10)
    if claim is not None:
        claim.unlink(missing_ok=True)
    return status if status is not None else proc.returncode
