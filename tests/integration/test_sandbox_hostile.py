"""Hostile programs against the bubblewrap sandbox: each gets the right verdict within its
limit + 1 s, the host is untouched, and the pool serves the next task normally."""

import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from infra.sandbox import SandboxError, SandboxPool, get_profile
from infra.sandbox.bwrap import SANDBOX_UID, bwrap_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")

WALL = 2.0
LIMITS = get_profile("python").limits.merged(wall_s=WALL)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool("python", size=2) as p:
        yield p
        assert p.stats["replaced"] == 0


def live_sandbox_processes(marker: str = "") -> list[str]:
    """Non-zombie processes of the sandbox uid that descend from this test process (optionally whose
    cmdline contains marker): another test process running sandboxes at the same time is not counted."""
    parent, state, cmdline = {}, {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            parent[pid], state[pid] = stat[1], stat[0]
            if os.stat(f"/proc/{pid}").st_uid == SANDBOX_UID:
                cmdline[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError):
            continue
    me = str(os.getpid())

    def descends_from_me(pid: str) -> bool:
        while pid in parent and pid not in ("0", "1"):
            pid = parent[pid]
            if pid == me:
                return True
        return False

    return [f"{pid} {cmd}" for pid, cmd in cmdline.items()
            if state[pid] != "Z" and marker in cmd and descends_from_me(pid)]


def run(pool, code, limits=LIMITS):
    start = time.monotonic()
    result = pool.exec(code=code, limits=limits)
    elapsed = time.monotonic() - start
    # the wall limit plus the time to kill and reap what the run left: 1 s on a quiet machine, but a fork
    # bomb's 32 processes took 2.0 s more under a full suite at load average 4-5 on 2 cores (4.01 s)
    assert elapsed < limits.wall_s + 3, f"took {elapsed:.2f}s for a {limits.wall_s}s limit"
    assert pool.exec(code="print('alive')").stdout == "alive\n"  # pool healthy afterwards
    return result


def settles_back_to(count: int, timeout: float = 2.0) -> bool:
    """The sandbox uid's live processes return to ``count`` (the idle boxes' waiting interpreters)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(live_sandbox_processes()) <= count:
            return True
        time.sleep(0.05)
    return False


def test_fork_bomb_is_contained(pool):
    time.sleep(0.3)  # let the idle boxes' interpreters finish starting
    idle = len(live_sandbox_processes())
    assert idle > 0, "the idle boxes' interpreters are seen (else the count below proves nothing)"
    r = run(pool, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert r.verdict in ("timeout", "cpu_limit")
    assert settles_back_to(idle), live_sandbox_processes()


def test_shell_fork_bomb_is_contained(pool):
    r = run(pool, "import subprocess; subprocess.run(['bash', '-c', ':(){ :|:& };:'])\nwhile True: pass")
    assert r.verdict in ("timeout", "cpu_limit")
    time.sleep(0.2)
    assert live_sandbox_processes(":|:&") == []


def test_memory_bomb(pool):
    r = run(pool, "x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))\n", LIMITS.merged(memory_mb=400))
    assert r.verdict == "memory" and "MemoryError" in r.stderr


def test_infinite_loop(pool):
    r = run(pool, "while True:\n    pass\n")
    assert r.verdict == "timeout" and r.signal is not None


def test_cpu_spin_in_many_threads_hits_cpu_limit(pool):
    code = "import threading\ndef spin():\n    while True: pass\nfor _ in range(32): threading.Thread(target=spin).start()\n"
    r = run(pool, code, LIMITS.merged(cpu_s=1, wall_s=5))
    assert r.verdict == "cpu_limit" and r.wall_s < 3  # RLIMIT_CPU counts all threads: SIGXCPU well before wall


def test_no_network_to_host_loopback(pool):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.3)
        port = server.getsockname()[1]
        code = (f"import socket\nfor host in ('127.0.0.1', '1.1.1.1'):\n"
                f"    try:\n        socket.create_connection((host, {port}), timeout=1); print(host, 'CONNECTED')\n"
                f"    except OSError as e:\n        print(host, type(e).__name__)\n")
        r = run(pool, code)
        with pytest.raises(TimeoutError):
            server.accept()
    assert r.verdict == "ok" and "CONNECTED" not in r.stdout
    assert "127.0.0.1 ConnectionRefusedError" in r.stdout and "1.1.1.1 OSError" in r.stdout


def test_no_host_secrets_or_env(pool, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    code = ("import os\nfor p in ('/etc/shadow', '/root', '/home', '/work/main', '/proc/1/environ', '/sys'):\n"
            "    print(p, os.path.exists(p))\nprint(sorted(os.environ))\nprint(open('/proc/1/cmdline').read())\n")
    r = run(pool, code)
    assert r.ok, r.stderr
    for p in ("/etc/shadow", "/root", "/home", "/work/main", "/sys"):
        assert f"{p} False" in r.stdout
    assert "host-secret" not in r.stdout and "AWS_SECRET_ACCESS_KEY" not in r.stdout
    assert "process_api" not in r.stdout  # PID 1 is bwrap's own init, not the host's


def test_cannot_write_outside_work_dir(pool):
    probe = f"temper-probe-{uuid.uuid4().hex}"
    code = (f"import os\nfor p in ('/usr/{probe}', '/etc/{probe}', '/{probe}', '/work/../{probe}'):\n"
            f"    try:\n        open(p, 'w').write('x'); print(p, 'WROTE')\n"
            f"    except OSError as e:\n        print(p, e.errno)\n"
            f"open('/tmp/{probe}', 'w').write('private tmp')\nopen('/work/ok.txt', 'w').write('fine')\n")
    r = run(pool, code)
    assert r.ok, r.stderr
    assert "WROTE" not in r.stdout
    for host_path in (f"/usr/{probe}", f"/etc/{probe}", f"/{probe}", f"/tmp/{probe}"):
        assert not os.path.exists(host_path)


def test_gigabyte_of_stdout_is_cut(pool):
    r = run(pool, "import sys\nchunk = b'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.buffer.write(chunk)\n")
    assert r.verdict == "output_limit" and r.truncated
    assert len(r.stdout) == LIMITS.output_bytes


def test_big_file_hits_file_size_limit(pool):
    r = run(pool, "open('big', 'wb').write(b'x' * (200 * 2**20))\n", LIMITS.merged(fsize_mb=16))
    assert r.verdict == "output_limit"


def test_orphaned_children_die_with_the_run(pool):
    marker = str(900 + os.getpid() % 97)
    code = (f"import os, subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
            f"if os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '{marker}'])\nprint('parent done')\n")
    r = run(pool, code)
    assert r.ok and r.wall_s < 1
    time.sleep(0.2)
    assert live_sandbox_processes(f"sleep {marker}") == []


def test_sigterm_ignoring_process_is_killed(pool):
    r = run(pool, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.05)\n")
    assert r.verdict == "timeout"


def test_symlink_planted_by_program_cannot_redirect_host_writes(pool):
    with pool.lease() as box:
        r = box.run(["ln", "-s", "/etc/hostname", "link"], LIMITS)
        assert r.ok
        before = Path("/etc/hostname").read_bytes()
        with pytest.raises(SandboxError):
            box.write_files({"link": "pwned"})
        with pytest.raises(SandboxError):
            box.read_file("link")
        with pytest.raises(SandboxError):
            box.write_files({"../escape": "x"})
        assert Path("/etc/hostname").read_bytes() == before


def test_pool_is_whole_after_the_barrage(pool):
    assert pool._idle.qsize() == pool.size + pool.spare and pool.pending == 0
    assert pool.exec(code="import os; print(sorted(os.listdir('.')))").stdout == "['main.py']\n"  # reclaimed


SYSCALL_PROBE = r'''
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(*args):
    return (libc.syscall(*args), ctypes.get_errno())
print(errno_of(101, 0, 0, 0, 0), errno_of(272, 0x10000000), errno_of(56, 0x10000000 | 17, 0, 0, 0),
      errno_of(425, 1, 0), errno_of(321, 0, 0, 0), errno_of(250, 0, 0), errno_of(323, 0))
t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
print(subprocess.run(["echo", "subprocess"], capture_output=True, text=True).stdout.strip())
import multiprocessing
with multiprocessing.Pool(2) as p:
    print(p.map(abs, [-1, -2]))
'''


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp table is x86_64's")
@pytest.mark.parametrize("path", ["warm", "cold"])
def test_seccomp_denies_kernel_interfaces_but_not_processes_or_threads(pool, path):
    """ptrace, unshare, clone(CLONE_NEWUSER), io_uring, bpf, keyctl, userfaultfd -> EPERM."""
    if path == "warm":
        r = run(pool, SYSCALL_PROBE)
    else:
        with pool.lease() as box:
            box.write_files({"probe.py": SYSCALL_PROBE})
            r = box.run(["python3", "-I", "-S", "probe.py"], LIMITS)  # not servable warm: a cold bwrap
    assert r.ok, r.stderr
    assert r.stdout.splitlines() == ["(-1, 1) " * 6 + "(-1, 1)", "thread", "subprocess", "[1, 2]"]


MANY_MODEST_PROCESSES = """
import os
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for _ in range(8):  # 8 x 300 MB: each under the 1536 MB RLIMIT_AS, together over the box's budget
    pid = os.fork()
    if pid == 0:
        os.close(ready_r); os.close(go_w)
        block = bytearray(300 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.close(ready_w)  # this child holds its 300 MB now
        os.read(go_r, 1)  # ...until every child holds or died: all are resident at once, whatever the load
        os._exit(0)
    kids.append(pid)
os.close(ready_w); os.close(go_r)
os.read(ready_r, 1)  # EOF once every child has closed its end: allocated, or killed
os.close(go_w)
print(sorted(os.waitpid(k, 0)[1] for k in kids))
"""


def test_memory_of_the_whole_box_is_bounded(pool):
    if pool.backend.cgroups is None:
        pytest.skip("no writable cgroup here: rlimits bound each process only")
    # the run ends at the box's OOM kill (~2 s quiet); the wall limit is only a backstop, long enough that 2.4 GB of
    # page faults finish on a loaded 2-core CI machine (8 s did not: 2.4 s of CPU in 8.7 s, verdict timeout)
    r = run(pool, MANY_MODEST_PROCESSES, LIMITS.merged(wall_s=40))
    assert r.verdict == "memory", r
    assert r.stdout.startswith("[0") and "9]" in r.stdout  # some children ran, the box's OOM killer ended others


def test_work_dir_has_a_disk_quota(pool):
    if not pool.backend.can_mount:
        pytest.skip("cannot mount a tmpfs per work dir here: only RLIMIT_FSIZE per file applies")
    code = "f = open('fill', 'wb')\nfor _ in range(40):\n    f.write(b'x' * 10 * 2**20)\n"
    r = run(pool, code, LIMITS.merged(fsize_mb=1000))  # no single-file limit in the way: the quota stops it
    assert r.verdict == "output_limit" and "No space left on device" in r.stderr
    assert pool.profile.limits.disk_mb < 400
