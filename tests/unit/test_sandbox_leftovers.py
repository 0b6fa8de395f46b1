"""The local sandbox backend reclaims what a killed backend left: only directories whose owner has died."""

from __future__ import annotations

import os
import subprocess
import sys

from infra.sandbox import leftovers


def _backend_dir(parent, name, owner: str | None):
    d = parent / name
    (d / "box1" / "work").mkdir(parents=True)
    if owner is not None:
        (d / leftovers.OWNER).write_text(owner)
    return d


def test_only_directories_of_dead_owners_are_swept(tmp_path):
    me = tmp_path / "temper-sandbox-me"
    me.mkdir()
    leftovers.mark_owner(me)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    ns = os.readlink("/proc/self/ns/pid")
    killed = _backend_dir(tmp_path, "temper-sandbox-killed", f"{pid} 1 {ns}")  # its process has exited
    alive = _backend_dir(tmp_path, "temper-sandbox-alive", (me / leftovers.OWNER).read_text())
    reused = _backend_dir(tmp_path, "temper-sandbox-reused", f"{os.getpid()} 0 {ns}")
    starting = _backend_dir(tmp_path, "temper-sandbox-starting", None)  # no owner written yet
    elsewhere = _backend_dir(tmp_path, "temper-sandbox-elsewhere", f"{pid} 1 pid:[1]")  # another PID namespace
    other = _backend_dir(tmp_path, "not-a-sandbox", f"{pid} 1 {ns}")
    unmounted = []
    swept = leftovers.sweep(me, unmounted.append, None)
    # a live pid whose start time differs is a reused pid: its backend is dead too
    assert sorted(swept) == sorted([killed, reused])
    assert not killed.exists() and not reused.exists()
    assert alive.exists() and starting.exists() and elsewhere.exists() and other.exists() and me.exists()
    assert unmounted == []  # nothing was mounted under them
