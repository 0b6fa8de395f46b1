"""The host's view of a sandbox's process tree, read from /proc: find a process in it, end a subtree.

Why: a run that times out used to be ended by killing the sandbox's whole process group at once,
so the process that accounts for the program's usage (GNU time, which reports the rusage of
the child it reaps) died with it and the result said a 2-second busy loop used 0.004 s of CPU.
Ending the program's subtree *below* the accountant, leaves first so each parent reaps its
children and their usage adds up, lets it report the real numbers before the group goes.

Only pids are used, no ptrace: the host is root and sees every pid of the sandbox's namespace.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live or zombie process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the command name in (...) may hold spaces
    return int(fields[1]), fields[0]


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process this host can see."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            table[int(name)] = st
    return table


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> list[tuple[int, int]]:
    """(pid, depth below root) of every descendant of ``root``, shallowest first."""
    table = processes() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, level, depth = [], [root], 0
    while level:
        depth += 1
        level = [c for p in level for c in sorted(children.get(p, ()))]
        found += [(c, depth) for c in level]
    return found


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def find(root: int, match: Callable[[list[str]], bool]) -> int | None:
    """The shallowest descendant of ``root`` whose argv ``match`` accepts (a deeper one could be a
    program's forgery of the same argv; the one the sandbox runtime started is above it)."""
    return next((pid for pid, _ in descendants(root) if match(cmdline(pid))), None)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def end_subtree(root: int, budget_s: float = 1.0) -> bool:
    """SIGKILL every descendant of ``root`` (not ``root`` itself), leaves first, each batch given a
    moment to be reaped by its parent. True when something was killed. Within ``budget_s``: what
    keeps forking past it is left to the caller's group kill (its usage is then not counted)."""
    deadline = time.monotonic() + budget_s
    killed = False
    while time.monotonic() < deadline:
        table = processes()
        live = [pid for pid, _ in descendants(root, table) if table[pid][1] != "Z"]
        if not live:
            break
        has_live_child = {table[pid][0] for pid in live}
        leaves = [pid for pid in live if pid not in has_live_child]
        for pid in leaves:
            _kill(pid)
        killed = True
        while time.monotonic() < deadline and any((st := _stat(pid)) is not None and st[1] != "Z" for pid in leaves):
            time.sleep(0.002)
        # a killed leaf stays a zombie until its parent reaps it; a parent blocked in wait reaps at once
        settle = time.monotonic() + 0.02
        while time.monotonic() < min(settle, deadline) and any(_stat(pid) is not None for pid in leaves):
            time.sleep(0.002)
    return killed


def wait_gone(pid: int, budget_s: float) -> bool:
    """Wait until ``pid`` has exited (gone or a zombie); False when it still runs after ``budget_s``."""
    deadline = time.monotonic() + budget_s
    while (st := _stat(pid)) is not None and st[1] != "Z":
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return True
