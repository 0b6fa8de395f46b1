"""What a killed local sandbox backend leaves on the machine, reclaimed by the next backend that starts.

A backend that ends normally removes its directory: each box unmounts its work dir's tmpfs and removes its
cgroup. A process that is SIGKILLed (a trainer killed mid-step, an OOM kill) cannot: its
``temper-sandbox-*`` directory stays under TMPDIR, with every box's tmpfs still mounted (the files the
episode wrote held in memory until unmounted) and every box's empty cgroup. Measured: one killed GRPO step
of two 500-turn episodes left its directory and both boxes (``tests/integration/test_long_episodes.py``).

So a backend writes its owner (pid, the process's start time, so a reused pid is not mistaken for it, and
its PID namespace) into its directory, and a new backend sweeps the directories beside its own whose owner
is gone; a directory made in another PID namespace (a container sharing the folder) is never judged: its
pids mean nothing here. Sweeping means: unmount
what is mounted under them, remove their boxes' cgroups, remove them. The processes that ran in the boxes
are gone already: bwrap runs with ``--die-with-parent``.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

OWNER = "owner"  # the file in a backend's directory: "<pid> <start time in clock ticks> <pid namespace>"


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/<pid>/stat), None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name, which may hold spaces


def _pid_namespace() -> str:
    return os.readlink("/proc/self/ns/pid")


def mark_owner(root: Path) -> None:
    (root / OWNER).write_text(f"{os.getpid()} {_start_time(os.getpid())} {_pid_namespace()}")


def _owner_alive(root: Path) -> bool:
    """False only when the owner is known dead: same PID namespace, and no process with its pid and start time.
    A directory without an owner (a backend starting right now, or an older temper's) is left alone."""
    try:
        pid, start, namespace = (root / OWNER).read_text().split()
    except (FileNotFoundError, ValueError):
        return True
    return namespace != _pid_namespace() or _start_time(int(pid)) == start


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or under ``root``, deepest first (field 5 of mountinfo; octal escapes undone)."""
    prefix = str(root) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def sweep(root: Path, umount, cgroups_parent: Path | None) -> list[Path]:
    """Reclaim every ``temper-sandbox-*`` directory beside ``root`` whose owner has died; the ones removed.
    ``umount(path)`` detaches a mount; ``cgroups_parent`` is where the boxes' cgroups are (None: none)."""
    swept = []
    for stale in sorted(root.parent.glob("temper-sandbox-*")):
        if stale == root or not stale.is_dir() or _owner_alive(stale):
            continue
        for point in _mounts_under(stale):
            umount(Path(point))
        if cgroups_parent is not None:
            for box in stale.iterdir():
                try:
                    (cgroups_parent / f"temper-{box.name}").rmdir()
                except OSError:  # no such cgroup (not a box), or it is busy: left for the next sweep
                    pass
        shutil.rmtree(stale, ignore_errors=True)
        swept.append(stale)
    if swept:
        log.info("sandbox: reclaimed %d directories of killed backends: %s", len(swept),
                 ", ".join(p.name for p in swept))
    return swept
