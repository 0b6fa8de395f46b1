"""Local jobs forked from a process that has already imported torch, transformers, TRL, DeepSpeed and MLflow.

Why: a local training rank or eval job spends ~10 s of CPU importing those libraries before its first step
(`python -X importtime`: transformers 4-5 s, torch 2 s, MLflow 1.5 s, DeepSpeed, TRL), and a 2-rank
training job starts three such processes (the launcher and its ranks). A small job is mostly that. A
zygote (the name Android gives the same idea) imports them once; each job is a fork of it.

Processes. ``python -m infra.job_zygote SOCKET`` imports ``PRELOAD`` and listens on a Unix socket. A job's
command is ``python job_zygote_client.py SOCKET -m MODULE ARGS``: the client connects, sends its argv,
environment and working directory with its stdin/stdout/stderr (SCM_RIGHTS), and waits. For each client the
zygote forks a *monitor* (its own session), which forks the *worker*: the worker takes the client's file
descriptors, environment and directory, and runs the module as ``python -m`` would. The monitor relays the
signals the client receives (SIGTERM, SIGINT, SIGHUP) to the worker's process group, kills that group when the
client dies (so killing the client's group, as ``run_job`` and ``stop_leftover`` do, ends the job) and sends
the worker's exit status back, which the client exits with. When the zygote cannot serve a job (not running,
or an environment that libraries read at import differs from its own: ``IMPORT_ENV``), the client runs the
command in a fresh interpreter instead.

What a fork shares and a fresh process does not, and how each is put right in the worker: the random
states (``random`` and NumPy reseeded from the OS; torch's generator was never used by the zygote, so it
is a fresh process's), the torch thread count (set from OMP_NUM_THREADS, as at a fresh start), the signal
dispositions (defaults), the hash seed (the zygote's: temper never depends on it; a job that sets
PYTHONHASHSEED is not served, being IMPORT_ENV). The zygote runs no torch operation, so no thread pool
exists to be lost across fork. Not on a GPU host: DeepSpeed's import probes CUDA, and CUDA cannot be used
in a process forked after it was initialized (``enabled``).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import json
import os
import random
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from glob import glob
from pathlib import Path

PRELOAD = ("torch", "numpy", "transformers", "transformers.trainer", "trl", "trl.trainer.sft_trainer",
           "trl.trainer.grpo_trainer", "deepspeed", "accelerate.commands.launch", "mlflow", "datasets", "pandas",
           "fsspec", "s3fs", "pydantic_settings", "yaml")
# environment variables that the preloaded libraries read when imported: a job whose values differ is not served
# (HOME, XDG_CACHE_HOME and TMPDIR: cache folders computed at import, tempfile's folder cached)
IMPORT_ENV = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "DATASETS_", "DS_", "PYTHON", "LD_", "TORCH_LOGS",
              "TORCHDYNAMO_", "TORCHINDUCTOR_", "HOME", "XDG_CACHE_HOME", "TMPDIR")
UNSERVED = b"cold"  # the zygote's answer to a request it does not serve
STARTED = b"S"  # ...and to one it does, once the worker runs (job_zygote_client.py); the exit status follows


CLIENT = str(Path(__file__).with_name("job_zygote_client.py"))
REPO = Path(__file__).resolve().parents[1]
_started: dict[str, subprocess.Popen] = {}  # this process's zygotes by key (a forked child has none of its own)
_owner = os.getpid()
_lock = threading.Lock()


def socket_for(env: dict[str, str], wait_s: float = 120.0) -> str | None:
    """This process's zygote for ``env``'s import environment, started at the first call: its socket once it has
    imported everything. The first job waits for that (the zygote's imports are the ones the job would make
    itself, so waiting costs no time, and running both would import twice on the same cores); None (the job
    starts as a fresh interpreter) when the zygote is not ready within ``wait_s`` or has exited."""
    key = hashlib.sha256(json.dumps([sys.executable, sorted(import_env(env).items())]).encode()).hexdigest()[:12]
    folder = tempfile.gettempdir() if len(tempfile.gettempdir()) < 60 else "/tmp"  # a socket path has 108 bytes
    path = Path(folder) / f"temper-zygote-{os.getpid()}-{key}.sock"
    global _owner
    with _lock:  # one start per key; jobs asking at once wait for the same zygote
        if os.getpid() != _owner:  # a fork of the process that started these: they are not its to use or stop
            _started.clear()
            _owner = os.getpid()
        proc = _started.get(key)
        if proc is None:
            path.unlink(missing_ok=True)  # a dead process's, whose pid this process has now
            with path.with_suffix(".log").open("ab") as log:
                proc = _started[key] = subprocess.Popen(
                    [sys.executable, "-m", "infra.job_zygote", str(path)], cwd=REPO, env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    return str(path) if proc.poll() is None and path.exists() else None


@atexit.register
def _stop_zygotes() -> None:
    if os.getpid() == _owner:
        for proc in _started.values():
            proc.terminate()


def enabled() -> bool:
    """CPU hosts only (no NVIDIA device nodes): see the module docstring."""
    return not glob("/dev/nvidia[0-9]*")


def import_env(env: dict[str, str]) -> dict[str, str]:
    """The part of ``env`` the preloaded libraries read at import. Not PYTHONPATH (accelerate adds the working
    directory for its ranks; the worker puts its entries on sys.path, as a fresh interpreter would: only a
    folder that shadows a preloaded library would differ) nor PYTHONUNBUFFERED (the worker's streams write
    through)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV) and k not in ("PYTHONPATH", "PYTHONUNBUFFERED")}


def read_request(sock: socket.socket) -> tuple[dict, list[int]]:
    """A client's request: a 4-byte length, then JSON (argv, env, cwd), its stdin/stdout/stderr attached. The
    client writes it (``job_zygote_client.py``, which imports nothing of the package, so the framing is there too)."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
    if len(data) < 4:
        raise ConnectionError("the client closed the connection before its request")
    (size,) = struct.unpack("!I", data[:4])
    data = data[4:]
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise ConnectionError("the client closed the connection mid-request")
        data += more
    return json.loads(data), list(fds)


def serve(path: str) -> None:
    """Preload, listen on ``path``, fork a monitor per connection until the process that started us is gone."""
    before = dict(os.environ)
    own = import_env(before)  # the environment of the job that started it: socket_for keys zygotes by IMPORT_ENV
    for name in PRELOAD:
        importlib.import_module(name)
    # what the imports set (torch: TORCHINDUCTOR_CACHE_DIR, ...), as they would have in a fresh job
    added = {k: v for k, v in os.environ.items() if k not in before}
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the socket goes (finally below)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, path)  # ready: clients connect only once every import is done
    parent = os.getppid()
    try:
        while os.getppid() == parent:
            if not select.select([listener], [], [], 1.0)[0]:
                continue
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _monitor(conn, own, added)
            conn.close()
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _monitor(conn: socket.socket, own: dict[str, str], added: dict[str, str]) -> None:
    """The forked monitor: start the worker, relay signals, report its exit status. Never returns."""
    code, pid = 1, 0
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        request, fds = read_request(conn)
        theirs = import_env(request["env"])
        if theirs != own or request["argv"][:1] != ["-m"] or len(fds) != 3:
            differ = sorted(k for k in {*theirs, *own} if theirs.get(k) != own.get(k))
            print(f"job zygote: not served (fresh interpreter): {' '.join(request['argv'][:2])}; "
                  f"import environment differs in {differ}", file=sys.stderr, flush=True)
            conn.sendall(UNSERVED)
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _worker(request, fds, added)
        for fd in fds:
            os.close(fd)
        conn.sendall(STARTED)
        print(f"job zygote: pid {pid} runs {' '.join(request['argv'][:2])}", file=sys.stderr, flush=True)
        pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None  # Linux 5.3+; else poll every 0.1 s
        while True:
            ready = select.select([conn] if pidfd is None else [conn, pidfd], [], [], 0.1 if pidfd is None else None)[0]
            ended, status = os.waitpid(pid, os.WNOHANG) if pidfd is None or pidfd in ready else (0, 0)
            if ended:
                _kill_group(pid, signal.SIGKILL)  # what the worker left running (run_job kills it too, cold)
                conn.sendall(json.dumps({"status": status}).encode())
                code = 0
                break
            if conn not in ready:
                continue
            data = conn.recv(64)
            if not data:  # the client died (SIGKILL of its group): the job goes with it
                _kill_group(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                code = 0
                break
            for signum in data:
                _kill_group(pid, signum)
    except BaseException:  # noqa: BLE001 - a monitor must never return into the zygote's loop
        traceback.print_exc()
        if pid:  # never leave a job running that nobody can stop
            _kill_group(pid, signal.SIGKILL)
    os._exit(code)


def _kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _worker(request: dict, fds: list[int], added: dict[str, str]) -> None:
    """The job itself, as ``python -m MODULE ARGS`` would run it in the client's place. Never returns."""
    code: int | str | None = 1
    try:
        os.setpgid(0, 0)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**added, **request["env"]})
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)
        random.seed()
        # lazy: loaded in the zygote already; at the top they would load (torch: 2 s) in every process that
        # starts jobs, through launcher_local
        import numpy as np
        import torch

        np.random.seed()
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        module, args = request["argv"][1], request["argv"][2:]
        sys.argv = [module, *args]
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[:1] = [request["cwd"], *extra]  # as `python -m`: the working directory, then PYTHONPATH
        sys.modules.pop(module, None)  # preloaded (the launcher): run as __main__ afresh, as `python -m` does
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code
        except BaseException:  # noqa: BLE001 - an uncaught exception: its traceback and status 1, as python does
            traceback.print_exc()
            code = 1
        threading._shutdown()  # as interpreter exit: join non-daemon threads, then atexit (multiprocessing does so)
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    serve(sys.argv[1])
