"""Per-box memory cgroups: one memory budget for everything a sandbox runs, where allowed.

rlimits bound each process (address space, CPU) but not their sum: 32 processes under a 1.5 GiB
RLIMIT_AS may hold 48 GiB between them. A cgroup bounds the whole tree, tmpfs pages included,
and the kernel's OOM killer then acts inside the box only, counting its kills (the memory
verdict). Boxes get a child cgroup of this process's own (so a container's budget still holds)
in cgroup v1's memory hierarchy, or in the v2 unified tree when its memory controller is
enabled for us. Where neither can be written (an unprivileged user, a read-only /sys/fs/cgroup)
``Cgroups.detect`` returns None and the sandbox relies on rlimits alone.

No pids controller: RLIMIT_NPROC already counts per run (each run has its own user namespace),
while a pids cgroup also counts the processes of earlier runs whose PID namespace the kernel is
still tearing down, so back-to-back runs of one box failed to fork.

A process enters through ``enter_argv``: a shell that writes its own pid into the box's
cgroup and then execs the sandbox, so nothing the sandbox starts can run outside it.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in a v1 controller's hierarchy ('' for v2's unified line)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


def _writable_child(parent: Path) -> bool:
    probe = parent / f"temper-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class Cgroups:
    """Where box cgroups are made: a directory in the v1 memory hierarchy or the v2 tree."""

    version: int
    parent: Path

    @classmethod
    def detect(cls) -> "Cgroups | None":
        v1 = ROOT / "memory"
        if (v1 / "memory.limit_in_bytes").exists():
            parent = v1 / (_own_path("memory") or "/").lstrip("/")
            return cls(1, parent) if _writable_child(parent) else None
        if (ROOT / "cgroup.controllers").exists():
            parent = ROOT / (_own_path("") or "/").lstrip("/")
            control = parent / "cgroup.subtree_control"
            if control.exists() and "memory" in control.read_text().split() and _writable_child(parent):
                return cls(2, parent)
        return None

    def create(self, name: str) -> "BoxCgroup":
        path = self.parent / name
        path.mkdir()
        return BoxCgroup(self.version, path)


@dataclass
class BoxCgroup:
    version: int
    path: Path
    _written: int | None = None

    def set_limit(self, memory_bytes: int) -> None:
        """Write the limit if it changed: a v1 memory.limit_in_bytes write drains per-CPU
        charge caches on every CPU, milliseconds on a busy machine."""
        if self._written == memory_bytes:
            return
        if self.version == 1:
            (self.path / "memory.limit_in_bytes").write_text(str(memory_bytes))
        else:
            (self.path / "memory.max").write_text(str(memory_bytes))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")
        self._written = memory_bytes

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def enter_argv(self) -> list[str]:
        """argv prefix: join this box's cgroup, then exec the rest of the command line."""
        procs = shlex.quote(str(self.path / "cgroup.procs"))
        return ["/bin/sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]

    def remove(self) -> None:
        """Remove the cgroup once its last processes have gone (the kernel tears a dead PID
        namespace down asynchronously, so an rmdir right after a run can meet EBUSY)."""
        for _ in range(200):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)
