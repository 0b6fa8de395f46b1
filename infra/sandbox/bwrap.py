"""Local backend: every run is a fresh bubblewrap container over a box's persistent work dir.

Isolation per run: new user, PID, network, IPC, UTS and cgroup namespaces; the host's /usr
read-only (with /bin, /lib, /lib64, /sbin as symlinks into it); from /etc only the loader cache,
alternatives, localtime and a generated passwd/group (never shadow); private /tmp and /dev/shm
tmpfs; the work dir bound at /work; the root remounted read-only; a scrubbed environment; no
capabilities. bwrap is exec'd as an unprivileged host uid (65534), because the kernel never
applies RLIMIT_NPROC to uid 0, and ``prlimit`` is the first command inside so the process limit
counts in the sandbox's own user namespace rather than across every sandbox of that uid.
Without ``--as-pid-1`` bwrap's init exits with the program and the kernel kills the whole PID
namespace: no orphan survives a run.

A run's files are written and read by the host (root). Between runs no sandbox process exists,
so resolving a path and refusing symlinks (O_NOFOLLOW + realpath inside the work dir) is enough
to stop a program from tricking the host into writing through a link it planted.
"""

from __future__ import annotations

import ctypes
import io
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path

from infra.sandbox import leftovers, proctree, seccomp
from infra.sandbox.api import Limits, Profile, Result, SandboxError, StateLimitError, ro_mount, safe_relpath
from infra.sandbox.cgroups import BoxCgroup, Cgroups
from infra.sandbox.forkserver import ForkServer, can_serve
from infra.sandbox.process import spawn, supervise
from infra.sandbox.snapshot import OverLimit, StateLimits, bounded_tar

SANDBOX_UID = 65534
SANDBOX_GID = 65534
WORK = "/work"
GNU_TIME = "/usr/bin/time"
_ETC_FILES = ("ld.so.cache", "localtime", "nsswitch.conf", "alternatives", "mime.types")
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1", "USER": "sandbox"}


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None and shutil.which("prlimit") is not None


class BwrapBackend:
    """Boxes under one host directory (root-owned, traversable only); see the module docstring."""

    name = "bwrap"

    def __init__(self, root: str | os.PathLike | None = None, uid: int = SANDBOX_UID, gid: int = SANDBOX_GID) -> None:
        if not bwrap_available():
            raise SandboxError("bubblewrap (bwrap) and prlimit are needed for the local sandbox: "
                               "apt-get install -y bubblewrap util-linux")
        if os.geteuid() != 0 and os.geteuid() != uid:
            raise SandboxError(f"the bwrap backend drops to uid {uid}; run it as root or as uid {uid}")
        self.uid, self.gid = uid, gid
        # Drop to the sandbox uid with setpriv rather than Popen(user=...): changing ids in the child
        # makes CPython fork instead of vfork, and forking a big parent (a trainer) costs ~20 ms.
        self.drop_privileges: list[str] = []
        self.spawn_ids: dict[str, int] = {}
        if os.geteuid() != uid:
            if shutil.which("setpriv"):
                self.drop_privileges = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
            else:
                self.spawn_ids = {"user": uid, "group": gid}
        self._owns_root = root is None
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="temper-sandbox-"))
        self.root.mkdir(parents=True, exist_ok=True)
        if self._owns_root:  # removed when the backend is collected or the process exits
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.root), True)
        os.chmod(self.root, 0o711)
        if self._owns_root:
            leftovers.mark_owner(self.root)
        etc = self.root / "etc"
        etc.mkdir(exist_ok=True)
        (etc / "passwd").write_text(f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
                                    f"sandbox:x:{uid}:{gid}:sandbox:{WORK}:/bin/bash\n")
        (etc / "group").write_text(f"root:x:0:\nsandbox:x:{gid}:\n")
        self._etc = [("--ro-bind", str(etc / "passwd"), "/etc/passwd"), ("--ro-bind", str(etc / "group"), "/etc/group")]
        self._etc += [("--ro-bind", f"/etc/{n}", f"/etc/{n}") for n in _ETC_FILES if os.path.exists(f"/etc/{n}")]
        self.seccomp = seccomp.program()  # None on an arch without a syscall table: no filter
        self.cgroups = Cgroups.detect() if os.geteuid() == 0 else None  # None: rlimits only
        self.can_mount = os.geteuid() == 0 and _mount_works(self.root)  # work dirs get their own tmpfs
        if self._owns_root:  # what killed backends left beside this one (see infra.sandbox.leftovers)
            leftovers.sweep(self.root, _umount, self.cgroups.parent if self.cgroups else None)
        help_text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True).stdout
        self.disable_userns = "--disable-userns" in help_text  # bwrap >= 0.8

    def create_box(self, profile: Profile) -> "BwrapBox":
        return BwrapBox(self, profile)

    def close(self) -> None:
        """Remove the backend's directory if it made it (boxes still open lose their work dirs)."""
        if self._owns_root:
            self._finalizer()

    def bwrap_argv(self, work: Path, argv: list[str], limits: Limits, env: Mapping[str, str],
                   stats_fd: int | None = None, seccomp_fd: int | None = None,
                   ro_paths: tuple[str, ...] = ()) -> list[str]:
        cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
               "--uid", str(self.uid), "--gid", str(self.gid), "--hostname", "sandbox",
               "--ro-bind", "/usr", "/usr"]
        if self.disable_userns:  # no nested user namespaces (which would give a run new capabilities)
            cmd += ["--unshare-user", "--disable-userns"]
        if seccomp_fd is not None:
            cmd += ["--seccomp", str(seccomp_fd)]
        for name in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink(f"/{name}"):
                cmd += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
            elif os.path.isdir(f"/{name}"):
                cmd += ["--ro-bind", f"/{name}", f"/{name}"]
        for flag, src, dst in self._etc:
            cmd += [flag, src, dst]
        for path in ro_paths:  # the profile's read-only library dirs (e.g. a venv's site-packages)
            cmd += ["--ro-bind", path, ro_mount(path)]
        tmp_bytes = str(limits.tmp_mb << 20)
        cmd += ["--proc", "/proc", "--dev", "/dev", "--size", tmp_bytes, "--tmpfs", "/tmp",
                "--size", tmp_bytes, "--tmpfs", "/dev/shm", "--bind", str(work), WORK, "--remount-ro", "/",
                "--chdir", WORK, "--clearenv"]
        for k, v in {**BASE_ENV, **env}.items():
            cmd += ["--setenv", k, v]
        mem, fsize = limits.memory_mb << 20, limits.fsize_mb << 20
        cmd += ["--", "prlimit", f"--nproc={limits.nproc}", f"--as={mem}", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
                f"--fsize={fsize}", f"--nofile={limits.nofile}", "--core=0", "--"]
        if stats_fd is not None:
            # bwrap does not wait for its init, so wait4 never sees the tree's usage: GNU time does.
            cmd += [GNU_TIME, "-q", "-f", "%U %S %M", "-o", f"/proc/self/fd/{stats_fd}"]
        return cmd + argv


def _stop_program(proc) -> bool:
    """End a run that ran out of time or output below GNU time, so time reaps the program and
    reports its real CPU and peak RSS (see infra.sandbox.proctree); True when it killed something."""
    timer = proctree.find(proc.pid, lambda argv: argv[:2] == [GNU_TIME, "-q"])
    if timer is None:  # no GNU time (a fork server's sandbox) or it is already gone
        return False
    killed = proctree.end_subtree(timer)
    proctree.wait_gone(timer, 0.5)  # it writes its report, then exits
    return killed


# How a program that never started reads on stderr (GNU time's exec, or bwrap's own without time),
# and the loader's words when it could not map a library under the address-space limit.
_NOT_STARTED = re.compile(rf"^(?:{re.escape(GNU_TIME)}: cannot run |bwrap: execvp )")
_LOADER = "error while loading shared libraries"
_LOADER_MEMORY = re.compile(r"failed to map segment|cannot allocate memory|cannot map zero-fill pages|"
                            r"cannot create shared object descriptor", re.I)


def _not_started(result: Result) -> Result:
    """'not_started' for a program that never ran (no such command or file, not executable, a
    library missing), 'memory' when the loader could not map it under the limit; else as it was.

    Before this a missing command read as verdict 'ok' with exit code 127, as if it had run.
    Exit status 127/126 alone is no proof (``bash -c nosuchcmd`` did start and says 127), so the
    sandbox runtime's own message, which comes before anything the program could print, decides.
    """
    err = result.stderr
    if result.verdict == "ok" and result.exit_code in (126, 127) and _LOADER in err.split("\n", 1)[0]:
        return result.model_copy(update={"verdict": "memory" if _LOADER_MEMORY.search(err) else "not_started"})
    starts = result.verdict == "ok" and result.exit_code in (126, 127) or result.verdict == "error"
    if starts and _NOT_STARTED.match(err):
        code = result.exit_code  # bwrap's own execvp failure exits 1: say it the shell's way
        if code not in (126, 127):
            code = 126 if "Permission denied" in err.split("\n", 1)[0] else 127
        return result.model_copy(update={"verdict": "not_started", "exit_code": code})
    return result


def _with_usage(result: Result, read_fd: int) -> Result:
    """CPU and peak RSS from GNU time's report (absent when the tree was killed before it wrote)."""
    try:
        os.set_blocking(read_fd, False)
        try:
            report = os.read(read_fd, 4096).decode(errors="replace").split()
        except BlockingIOError:
            report = []
    finally:
        os.close(read_fd)
    try:
        user, system, rss_kb = float(report[-3]), float(report[-2]), float(report[-1])
    except (IndexError, ValueError):
        return result
    return result.model_copy(update={"cpu_s": round(user + system, 3), "max_rss_mb": round(rss_kb / 1024, 2)})


_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH, _MS_NOSUID, _MS_NODEV = 2, 2, 4


def _mount_tmpfs(path: Path, size_mb: int, uid: int, gid: int) -> bool:
    """A size-capped tmpfs on path: the work dir's disk quota (ENOSPC past it). False if refused."""
    options = f"size={size_mb}m,mode=0700,uid={uid},gid={gid}".encode()
    return _libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) == 0


def _umount(path: Path) -> None:
    _libc.umount2(str(path).encode(), _MNT_DETACH)


def _mount_works(root: Path) -> bool:
    probe = Path(tempfile.mkdtemp(dir=root, prefix="mount-probe-"))
    try:
        ok = _mount_tmpfs(probe, 1, 0, 0)
        if ok:
            _umount(probe)
        return ok
    finally:
        probe.rmdir()


class BwrapBox:
    """One work dir on the host; each ``run`` is a new bwrap over it."""

    def __init__(self, backend: BwrapBackend, profile: Profile) -> None:
        self.backend, self.profile = backend, profile
        self.id = uuid.uuid4().hex[:12]
        self.dir = backend.root / self.id
        self.work = self.dir / "work"
        self.dir.mkdir(mode=0o711)
        self.work.mkdir(mode=0o700)
        self.mounted = backend.can_mount and _mount_tmpfs(self.work, profile.limits.disk_mb, backend.uid, backend.gid)
        os.chown(self.work, self.backend.uid, self.backend.gid)
        self.cgroup: BoxCgroup | None = backend.cgroups.create(f"temper-{self.id}") if backend.cgroups else None
        self.closed = False
        self._server: ForkServer | None = None  # the warm path (python profile), see infra.sandbox.forkserver

    def _budget(self, limits: Limits) -> None:
        """The box cgroup's limits for the next run: its memory plus what its tmpfs may hold."""
        if self.cgroup is not None:
            disk = self.profile.limits.disk_mb if self.mounted else 0
            self.cgroup.set_limit((limits.memory_mb + 2 * limits.tmp_mb + disk) << 20)

    def _host_path(self, path: str) -> Path:
        rel = safe_relpath(path)
        target = self.work / rel
        parent = Path(os.path.realpath(target.parent))
        if parent != self.work and self.work not in parent.parents:
            raise SandboxError(f"file path {path!r} resolves outside the work dir (through a symlink)")
        return parent / target.name

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        for name, content in files.items():
            target = self._host_path(name)
            rel_parts = target.relative_to(self.work).parts[:-1]
            d = self.work
            for part in rel_parts:
                d = d / part
                if not d.exists():
                    d.mkdir()
                    os.chown(d, self.backend.uid, self.backend.gid)
            data = content.encode() if isinstance(content, str) else content
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            except OSError as e:
                raise SandboxError(f"box {self.id}: cannot write {name!r}: {e.strerror}") from None
            try:
                os.write(fd, data)
                os.fchown(fd, self.backend.uid, self.backend.gid)
            finally:
                os.close(fd)

    def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes:
        target = self._host_path(path)
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise SandboxError(f"box {self.id}: cannot read {path!r}: {e.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxError(f"box {self.id}: {path!r} is not a regular file")
            return os.read(fd, max_bytes)
        finally:
            os.close(fd)

    def _spawn(self, argv: list[str], limits: Limits, env: Mapping[str, str], pass_fd: int | None = None,
               usage: bool = True):
        """bwrap over the work dir; ``usage``: GNU time reports CPU and peak RSS on the returned fd."""
        read_fd, write_fd = os.pipe() if usage and os.path.exists(GNU_TIME) else (None, None)
        filter_fd = None
        try:
            if write_fd is not None:
                os.fchown(write_fd, self.backend.uid, self.backend.gid)  # GNU time reopens it as the sandbox uid
            if self.backend.seccomp is not None:  # bwrap reads the filter from a pipe, once
                filter_fd, filter_w = os.pipe()
                os.write(filter_w, self.backend.seccomp)  # < 1 KiB: fits in the empty pipe
                os.close(filter_w)
            cmd = self.backend.bwrap_argv(self.work, list(argv), limits, env, stats_fd=write_fd, seccomp_fd=filter_fd,
                                          ro_paths=self.profile.ro_paths)
            fds = tuple(fd for fd in (write_fd, pass_fd, filter_fd) if fd is not None)
            self._budget(limits)
            enter = self.cgroup.enter_argv() if self.cgroup is not None else []
            proc = spawn(enter + self.backend.drop_privileges + cmd, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                         pass_fds=fds, **self.backend.spawn_ids)
        finally:
            for fd in (write_fd, filter_fd):
                if fd is not None:
                    os.close(fd)
        return proc, read_fd

    def _finish(self, proc, read_fd: int | None, limits: Limits, stdin: bytes | None) -> Result:
        result = supervise(proc, limits, stdin, signal_from_exit=True, stop=_stop_program)
        if read_fd is not None:
            result = _with_usage(result, read_fd)
        if result.verdict == "ok" and result.exit_code == 1 and result.stderr.startswith(("bwrap:", "prlimit:")):
            result = result.model_copy(update={"verdict": "error"})
        return _not_started(result)

    def warm(self) -> None:
        """Python profile: keep a fork server running in this box (see infra.sandbox.forkserver)."""
        if self._server is not None and not self._server.alive():
            self._drop_warm()
        if self._server is None and not self.closed and self.profile.code_argv[0] == "python3":
            self._server = ForkServer(lambda argv, fd: self._spawn(argv, self.profile.limits, {}, fd, usage=False)[0],
                                      paths=tuple(ro_mount(p) for p in self.profile.ro_paths),
                                      preload=self.profile.preload)

    def _drop_warm(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def run(self, argv: list[str], limits: Limits, stdin: bytes | None = None,
            env: Mapping[str, str] | None = None) -> Result:
        if self.closed:
            raise SandboxError(f"box {self.id} is closed")
        argv = list(argv)
        ooms = self.cgroup.oom_kills() if self.cgroup is not None else 0
        result = None
        if self._server is not None and can_serve(argv, limits, self.profile.limits, env):
            self._budget(limits)
            result = self._server.run(argv, limits, stdin)
            if not self._server.alive() or result is None:
                self._drop_warm()  # the pool's release warms a new one
        if result is None:
            proc, read_fd = self._spawn(argv, limits, env or {})
            result = self._finish(proc, read_fd, limits, stdin)
        if self.cgroup is not None and self.cgroup.oom_kills() > ooms and result.verdict != "timeout":
            result = result.model_copy(update={"verdict": "memory"})  # the box's OOM killer ended a process
        return result

    def snapshot(self, limits: StateLimits | None = None) -> bytes:
        try:  # checked with lstat before any file is read; links stored as links, never followed
            return bounded_tar(str(self.work), limits or StateLimits())
        except OverLimit as e:
            raise StateLimitError(f"box {self.id}: work dir over its snapshot limits: {e}") from None

    def restore(self, archive: bytes) -> None:
        self.reset()
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
            tar.extractall(self.work, filter="data")  # 'data' rejects absolute paths and links out
        for dirpath, dirnames, filenames in os.walk(self.work):
            for name in dirnames + filenames:
                os.lchown(os.path.join(dirpath, name), self.backend.uid, self.backend.gid)

    def reset(self) -> None:
        # Nothing of an earlier run is alive: a cold run's PID namespace died with it, and the fork
        # server kills every process but itself before it reports. Only files remain. The work dir
        # itself stays (a running fork server has it bound at /work); its contents go.
        for entry in os.scandir(self.work):  # an error here makes the pool replace the box
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)

    def healthy(self) -> bool:
        return not self.closed and self.work.is_dir() and not self.work.is_symlink()

    def close(self) -> None:
        if not self.closed:
            self._drop_warm()
            self.closed = True
            if self.mounted:
                _umount(self.work)
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.cgroup is not None:
                self.cgroup.remove()
