"""A Python fork server inside a box's sandbox: the warm path of the python profile.

Creating namespaces and starting an interpreter is most of a short program's cost (on the
2-core dev machine: bare ``python3 -I`` ~9 ms, bwrap's namespaces another ~7 ms). A warm box
keeps one sandbox alive (same bwrap isolation and profile limits as a cold run) whose
interpreter never runs untrusted code itself: for each run it receives the run's stdin, stdout
and stderr over a socket (SCM_RIGHTS), forks, and the child lowers its rlimits and runs FILE as
``__main__`` the way ``python3 -I FILE`` would (isolated flags, absolute ``__file__``,
``sys.argv``, traceback without the server's frame, exit status 1 on an uncaught exception, 2
for a missing file, atexit handlers and non-daemon threads finished).

After the child exits the server reclaims the sandbox before it reports: ``kill(-1, SIGKILL)``
until no other process of the sandbox's PID namespace is left (orphans included), ``/tmp`` and
``/dev/shm`` emptied. A run that leaves what the server cannot remove (SysV IPC objects) makes
it say so and exit: the box starts a fresh sandbox. The server is non-dumpable (PR_SET_DUMPABLE 0), so a run, although the
same uid, can neither ptrace it nor touch its memory through /proc: one program cannot change
how the next one is judged. A run that kills or stops the server, times out or floods output
takes the whole sandbox down with it (the host kills its process group); the box starts a new
one before its next run.

Differences from a fresh interpreter, on purpose: modules the server imported (os, sys,
socket, resource, array, ctypes, shutil, json and their dependencies) are already in sys.modules.
A profile may add ``paths`` (appended to sys.path) and ``preload``: Python source the server runs
once before serving, as module ``__temper_preload__`` (the reasoning_gym profile imports
reasoning_gym and builds its scorers there: ~4 s once per box instead of per answer). A preload
that fails ends the server, so runs go cold and see the same failure themselves.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping

from infra.sandbox import proctree
from infra.sandbox.api import Limits, Result
from infra.sandbox.process import collect, finish

SERVER = r"""
import array, ctypes, json, os, resource, shutil, socket, sys, time
_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: runs cannot ptrace this process or open its /proc/pid/mem
_ctl = socket.socket(fileno=int(sys.argv[1]))
_boot = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
sys.path.extend(p for p in _boot.get("paths", ()) if p not in sys.path)
if _boot.get("preload"):
    _pre = sys.modules["__temper_preload__"] = type(sys)("__temper_preload__")
    exec(compile(_boot["preload"], "<preload>", "exec"), _pre.__dict__)
_ctl.send(b"ready")  # the host starts a run's clock only after this: a slow preload is not the run's time
_NAMES = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE")


def _exit_code(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        sys.stderr.write(f"{e.code}\n")
    except Exception:
        pass
    return 1


def _end(code):
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _child(payload, fds):
    try:
        _ctl.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        _libc.prctl(4, 1, 0, 0, 0)  # a normal, dumpable process, like a fresh python
        os.chdir("/work")
        fields = payload.decode("utf-8", "surrogateescape").split("\0")
        limits = [int(v) for v in fields[0].split()]
        for i, name in enumerate(_NAMES):
            res = getattr(resource, name)
            top = resource.getrlimit(res)[1]
            soft, hard = limits[2 * i], limits[2 * i + 1]
            if top != resource.RLIM_INFINITY:
                soft, hard = min(soft, top), min(hard, top)
            resource.setrlimit(res, (soft, hard))
        sys.argv = fields[3:]
        path = os.path.abspath(sys.argv[0])
        try:
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec", dont_inherit=True)
        except OSError as e:
            sys.stderr.write(f"python3: can't open file {path!r}: [Errno {e.errno}] {e.strerror}\n")
            _end(2)
        except SyntaxError as e:
            import traceback
            traceback.print_exception(e.__class__, e, None)
            _end(1)
        main = type(sys)("__main__")
        main.__file__ = path
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        try:
            exec(code, main.__dict__)
        except SystemExit as e:
            _end(_exit_code(e))
        except BaseException as e:
            import traceback
            traceback.print_exception(e.__class__, e, e.__traceback__.tb_next)
            _end(1)
        _end(0)
    finally:
        os._exit(70)


def _reclaim():  # kill every other process, empty /tmp and /dev/shm; False: replace the sandbox
    for _ in range(4000):  # kill(-1) spares this process and the namespace's init (bwrap)
        try:
            os.kill(-1, 9)
        except ProcessLookupError:
            break
        time.sleep(0.0005)
    else:
        return False
    for d in ("/tmp", "/dev/shm"):
        for entry in os.scandir(d):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        if os.listdir(d):
            return False
    for kind in ("shm", "sem", "msg"):  # SysV IPC objects outlive their processes
        with open(f"/proc/sysvipc/{kind}") as f:
            if len(f.readlines()) > 1:
                return False
    return True

while True:
    msg, anc, _, _ = _ctl.recvmsg(1 << 20, socket.CMSG_SPACE(3 * 4))
    if not msg:
        break
    fds = array.array("i")
    for _level, _kind, data in anc:
        fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    pid = os.fork()
    if pid == 0:
        _child(msg, list(fds))
    for fd in fds:
        os.close(fd)
    _, status, ru = os.wait4(pid, 0)
    clean = _reclaim()
    _ctl.send(f"{status} {ru.ru_utime} {ru.ru_stime} {ru.ru_maxrss} {int(clean)}".encode())
    if not clean:
        break
"""

_PYTHONS = ("python3", "/usr/bin/python3")
# What a run's stderr ends with when the run killed its box's fork server (kill -9 -1 and the like):
# the program's doing, so verifiers score it 0 rather than "not judged".
SERVER_ENDED = "fork server ended during the run"
_PIPE_CAPACITY = 65536


def _rlimits(limits: Limits) -> list[int]:
    """(soft, hard) of AS, CPU, NPROC, FSIZE, NOFILE, flattened in the server's order."""
    mem, fsize = limits.memory_mb << 20, limits.fsize_mb << 20
    return [mem, mem, limits.cpu_s, limits.cpu_s + 1, limits.nproc, limits.nproc, fsize, fsize,
            limits.nofile, limits.nofile]


def can_serve(argv: list[str], limits: Limits, warm_limits: Limits, env: Mapping[str, str] | None) -> bool:
    """The fork server can run this request: ``python3 -I FILE ...``, no extra env, limits not raised."""
    if env or len(argv) < 3 or argv[0] not in _PYTHONS or argv[1] != "-I" or argv[2].startswith("-"):
        return False
    fields = ("memory_mb", "cpu_s", "nproc", "fsize_mb", "nofile")
    return limits.tmp_mb == warm_limits.tmp_mb and all(getattr(limits, f) <= getattr(warm_limits, f) for f in fields)


def request(argv: list[str], limits: Limits) -> bytes:
    """NUL-separated: the rlimits, then argv (argv cannot hold NUL bytes); one seqpacket message."""
    return "\0".join([" ".join(map(str, _rlimits(limits))), *argv]).encode("utf-8", "surrogateescape")


def _write_all(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # the program closed its stdin
    finally:
        os.close(fd)


class ForkServer:
    """Host side of one sandbox running SERVER; ``run`` is one program, ``close`` ends the sandbox."""

    def __init__(self, spawn, paths: tuple[str, ...] = (), preload: str | None = None) -> None:
        """``spawn(argv, pass_fd)`` starts argv in the box's sandbox with pass_fd inherited;
        ``paths`` and ``preload`` as in the module docstring."""
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = ["python3", "-I", "-c", SERVER, str(theirs.fileno())]
        if paths or preload:
            argv.append(json.dumps({"paths": list(paths), "preload": preload}))
        try:
            self.proc = spawn(argv, theirs.fileno())
        finally:
            theirs.close()
        self.proc.stdin.close()
        self.ready = False

    def _wait_ready(self, timeout_s: float = 300.0) -> bool:
        """Block until the server has run its preload and said so; False if it died or took too long."""
        if not self.ready:
            self.ctl.settimeout(timeout_s)
            try:
                self.ready = self.ctl.recv(16) == b"ready"
            except OSError:
                self.ready = False
            finally:
                self.ctl.settimeout(None)
        return self.ready

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv: list[str], limits: Limits, stdin: bytes | None) -> Result | None:
        """Run one program; None when the server was already gone (the caller runs it cold)."""
        if not self._wait_ready():
            self.close()
            return None
        start = time.monotonic()
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.ctl.sendmsg([request(argv, limits)],
                             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [in_r, out_w, err_w]))])
        except OSError:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            self.close()
            return None
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        if stdin and len(stdin) > _PIPE_CAPACITY:
            threading.Thread(target=_write_all, args=(in_w, stdin), daemon=True).start()
        else:
            _write_all(in_w, stdin or b"")  # fits in the empty pipe: cannot block
        try:
            (out, err), total, reason = collect([out_r, err_r], self.ctl.fileno(), limits, start + limits.wall_s)
        finally:
            os.close(out_r)
            os.close(err_r)
        if reason is not None:
            # timeout or output cap: end the run's processes below the server, which reaps its child and reports
            # the usage it got from wait4 (killing the whole sandbox at once reported 0 CPU for a 2 s busy loop)
            server = proctree.find(self.proc.pid, lambda argv: argv[:4] == ["python3", "-I", "-c", SERVER])
            if server is not None:
                proctree.end_subtree(server)
        status = self._status(wait_s=1.0 if reason is not None else 0.0)
        if reason is not None:  # the run is not trusted to have left the sandbox reusable: end it either way
            self.close()
            used = (float(status[1]) + float(status[2]), float(status[3])) if status else (0.0, 0.0)
            return finish(out, err, total, reason, limits, time.monotonic() - start, None, signal.SIGKILL, *used)
        if not status:  # the server died (a run killed it): end the sandbox
            self.close()  # SIGKILL to the sandbox's whole tree, as for a cold run
            err += f"\nsandbox: the {SERVER_ENDED}\n".encode()
            return finish(out, err, total, "error", limits, time.monotonic() - start, None, signal.SIGKILL, 0.0, 0.0)
        wait_status, utime, stime, rss_kb = int(status[0]), float(status[1]), float(status[2]), float(status[3])
        if status[4] != b"1":  # the server could not reclaim the sandbox and is exiting
            self.close()
        code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None
        sig = os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None
        return finish(out, err, total, None, limits, time.monotonic() - start, code, sig, utime + stime, rss_kb)

    def _status(self, wait_s: float) -> list[bytes] | None:
        """The server's report of the run (wait status, utime, stime, max RSS in KB, reclaimed), waiting at most
        ``wait_s`` for it; None when there is none (the server died, or did not report in time)."""
        try:
            if wait_s > 0:
                self.ctl.settimeout(wait_s)
            else:
                self.ctl.setblocking(False)
            return self.ctl.recv(256).split() or None
        except OSError:
            return None
        finally:
            self.ctl.setblocking(True)

    def close(self) -> None:
        """Kill the sandbox's process group and reap it; idempotent."""
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            for stream in (self.proc.stdout, self.proc.stderr):
                stream.close()
        self.ctl.close()
