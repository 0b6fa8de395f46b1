"""The executor that runs inside a sandbox pod, one process per exec (stdlib only).

``infra.sandbox.kubernetes`` sends this file's source as ``python3 -I -c SOURCE`` on every
exec, so nothing the sandboxed program writes can replace it between runs. What the plain
exec API cannot do, it does inside the pod:

- limits: the run's rlimits (address space, CPU, file size, open files; the process count only
  in a user namespace, since outside one RLIMIT_NPROC counts every uid-1000 process of the node)
  and its wall clock, enforced next to the program rather than across the API connection;
- verdicts: the exit status and signal from ``wait4``, timeout and output cap from the loop
  below, and OOM kills from the container cgroup's ``oom_kill`` counter (a kernel OOM kill is a
  bare SIGKILL otherwise);
- no leftovers: /tmp emptied before each run; the executor is the child subreaper of the run, so
  whatever the program forks or daemonises stays its descendant and is killed and reaped after
  it (PID 1 of the pod is an idle ``sleep`` that would never reap orphans); a reset kills (in a
  pod only) every process but PID 1;
- file transfer: tar in and out of the work dir, a snapshot bounded before it is read
  (``infra.sandbox.snapshot``, whose stdlib-only source ``infra.sandbox.kubernetes`` sends ahead
  of this file's: a pod need not have temper installed).

Protocol. stdin: ``<n>\\n`` + an n-byte JSON request + ``request['payload_len']`` payload bytes
(a run's stdin, or a tar), so no end-of-stdin signal is needed (older API servers cannot close
an exec's stdin). stdout: the program's stdout, or an op's data. stderr: the program's stderr,
then ``\\n<nonce> <json trailer>\\n``. The nonce travels on stdin, which the program never
sees, and the executor is made non-dumpable so its memory cannot be read for it.
"""

from __future__ import annotations

import io
import json
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time

if "bounded_tar" not in globals():  # on the host; in a pod, the source shipped ahead of this one defines them
    from infra.sandbox.snapshot import OverLimit, StateLimits, bounded_tar

DRAIN_S = 0.2  # after the program exits, how long its pipes may stay open (orphans holding them)
POLL_S = 0.05  # exit detection without pidfd (gVisor and old kernels lack it)


def read_request(stream) -> tuple[dict, bytes]:
    n = int(stream.readline())
    req = json.loads(stream.read(n))
    payload = stream.read(int(req.get("payload_len", 0)))
    return req, payload


def oom_kills(paths: list[str]) -> int | None:
    """The container cgroup's OOM-kill count (cgroup v2 memory.events, v1 memory.oom_control)."""
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def in_user_namespace() -> bool:
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def rlimit_setter(limits: dict, nproc: bool):
    mem, fsize = int(limits["memory_mb"]) << 20, int(limits["fsize_mb"]) << 20
    cpu = int(limits["cpu_s"])
    values = [(resource.RLIMIT_AS, (mem, mem)), (resource.RLIMIT_CPU, (cpu, cpu + 1)),
              (resource.RLIMIT_FSIZE, (fsize, fsize)), (resource.RLIMIT_NOFILE, (int(limits["nofile"]),) * 2),
              (resource.RLIMIT_CORE, (0, 0))]
    if nproc:
        values.append((resource.RLIMIT_NPROC, (int(limits["nproc"]),) * 2))

    def apply() -> None:
        for res, (soft, hard) in values:
            top = resource.getrlimit(res)[1]
            if top != resource.RLIM_INFINITY:
                soft, hard = min(soft, top), min(hard, top)
            resource.setrlimit(res, (soft, hard))
    return apply


def empty_dir(path: str) -> None:
    """Remove a directory's content (not the directory: it is a mount point)."""
    try:
        entries = os.listdir(path)
    except OSError:
        return
    for name in entries:
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            try:
                os.unlink(full)
            except OSError:
                pass


def may_reap(uid: int, pid1_cmdline: bytes) -> bool:
    """Only in a sandbox pod (idle PID 1 ``sleep``, non-root) may the executor kill 'everything else'."""
    return uid != 0 and pid1_cmdline.split(b"\0", 1)[0].rsplit(b"/", 1)[-1] == b"sleep"


def reap_strays() -> int:
    """Kill every process of the pod except PID 1 and this one: what daemonised runs left behind."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            pid1 = f.read()
    except OSError:
        return 0
    if not may_reap(os.getuid(), pid1):
        return 0
    me, killed = os.getpid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (1, me):
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:  # fields after "(comm)": state, ppid, ...
                kids.append(int(entry))
    return kids


def kill_descendants() -> None:
    """SIGKILL and reap every descendant (orphans reparent to us: we are the subreaper)."""
    me = os.getpid()
    for _ in range(200):  # bounded: a process stuck in the kernel (D state) must not hang the exec
        kids = _children(me)
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(0.005)


def _kill_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except OSError:
            pass


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except OSError:
        pass


def run(req: dict, payload: bytes, out, err) -> dict:
    """Run req['argv'] under req['limits']; copy its output (capped) to out/err; return the trailer."""
    limits = req["limits"]
    empty_dir(req["tmp_dir"])
    before = oom_kills(req["oom_files"])
    start = time.monotonic()
    deadline = start + float(limits["wall_s"])
    try:
        proc = subprocess.Popen(req["argv"], cwd=req["work_dir"], env=req["env"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                close_fds=True, preexec_fn=rlimit_setter(limits, in_user_namespace()))
    except OSError as e:
        err.write(f"executor: cannot run {req['argv'][0]!r}: {e.strerror}\n".encode())
        return {"exit_code": 127, "signal": None, "timed_out": False, "output_exceeded": False,
                "oom_kills": 0, "wall_s": 0.0, "cpu_s": 0.0, "max_rss_mb": 0.0, "truncated": False}
    threading.Thread(target=_feed, args=(proc.stdin, payload), daemon=True).start()
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    sel = selectors.DefaultSelector()
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pidfd = None
    cap, total = int(limits["output_bytes"]), 0
    timed_out = exceeded = False
    status = usage = exited_at = None
    open_pipes = len(sinks)
    try:
        while not exceeded:
            now = time.monotonic()
            if status is None:
                pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    status, usage, exited_at = st, ru, now
                    if pidfd is not None:
                        sel.unregister(pidfd)
            if status is not None:
                if open_pipes == 0 or now - exited_at >= DRAIN_S:
                    break  # exited and drained (or stragglers hold the pipes: they die below)
                wait = DRAIN_S - (now - exited_at)
            elif now >= deadline:
                timed_out = True
                break
            else:
                wait = deadline - now if pidfd is not None else min(POLL_S, deadline - now)
            for key, _ in sel.select(max(0.0, wait)):
                if key.fd == pidfd:
                    continue  # exit: reaped at the top of the loop
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    open_pipes -= 1
                    continue
                keep = max(0, min(len(chunk), cap - total))
                if keep:
                    sinks[key.fd].write(chunk[:keep])
                total += len(chunk)
                if total > cap:
                    exceeded = True
                    break
    finally:
        _kill_group(proc.pid)
        if status is None:
            _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    kill_descendants()
    after = oom_kills(req["oom_files"])
    return {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out, "output_exceeded": exceeded,
        "oom_kills": (after - before) if before is not None and after is not None else 0,
        "wall_s": round(time.monotonic() - start, 4),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 4), "max_rss_mb": round(usage.ru_maxrss / 1024, 2),
        "truncated": total > cap,
    }


def _extract(work: str, archive: bytes) -> None:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(work, filter="data")  # rejects absolute paths, '..' and links out
        else:  # Python < 3.11.4: the client only ever sends regular files with checked names
            tar.extractall(work)


def read_file(work: str, path: str, max_bytes: int, out) -> None:
    fd = os.open(os.path.join(work, path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        out.write(os.read(fd, max_bytes))
    finally:
        os.close(fd)


def snapshot(work: str, limits: dict, out) -> None:
    """The work dir as a tar, refused from lstat alone (before a byte is read or sent to the host)
    when it breaks the request's StateLimits (see infra.sandbox.snapshot)."""
    out.write(bounded_tar(work, StateLimits(**limits)))


def handle(req: dict, payload: bytes, out, err) -> dict:
    op, work = req["op"], req["work_dir"]
    if op == "run":
        return run(req, payload, out, err)
    try:
        if op == "write":
            _extract(work, payload)
        elif op == "read":
            read_file(work, req["path"], int(req["max_bytes"]), out)
        elif op == "snapshot":
            snapshot(work, req.get("limits", {}), out)
        elif op in ("reset", "restore"):
            reap_strays()
            empty_dir(work)
            empty_dir(req["tmp_dir"])
            if op == "restore":
                _extract(work, payload)
        else:
            return {"error": f"unknown op {op!r}"}
    except OverLimit as e:
        return {"error": str(e), "state_limit": True}
    except (OSError, tarfile.TarError) as e:
        return {"error": getattr(e, "strerror", None) or str(e)}
    return {}


def _prctl_setup() -> None:
    try:
        # lazy: best effort inside the try; a box whose Python lacks ctypes still serves
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the program cannot read our memory (the nonce)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the run become our children
    except (OSError, AttributeError, ImportError):
        pass


def main() -> None:
    _prctl_setup()
    req, payload = read_request(sys.stdin.buffer)
    out, err = sys.stdout.buffer, sys.stderr.buffer
    trailer = handle(req, payload, out, err)
    out.flush()
    err.write(b"\n" + req["nonce"].encode() + b" " + json.dumps(trailer).encode() + b"\n")
    err.flush()


if __name__ == "__main__":
    main()
