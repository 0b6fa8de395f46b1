"""The warm path forks every program from one long-lived server per box: no run may leave
anything behind for the next run of that box, or change how the next run is judged."""

import pytest

from infra.sandbox import SandboxPool
from infra.sandbox.bwrap import bwrap_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")


@pytest.fixture()
def one_box():
    """One box, no spare: consecutive runs share the box and its fork server."""
    with SandboxPool("python", size=1, spare=0) as pool:
        yield pool


def server_pid(pool) -> int:
    with pool.lease(timeout=5) as box:  # waits for the previous run's reclaim
        return box._server.proc.pid


def test_runs_share_the_server_but_no_state(one_box):
    pid = server_pid(one_box)
    first = one_box.exec(code=(
        "import builtins, os, subprocess\n"
        "builtins.LEAK = 1\n"
        "open('/tmp/left', 'w').write('x'); open('/dev/shm/left', 'w').write('x'); open('here', 'w').write('x')\n"
        "subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "print(os.getpid())\n"))
    assert first.ok, first.stderr
    second = one_box.exec(code=(
        "import builtins, os\n"
        "others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())]\n"
        "print(hasattr(builtins, 'LEAK'), os.listdir('/tmp'), os.listdir('/dev/shm'), sorted(os.listdir('.')), others)\n"))
    assert second.stdout == "False [] [] ['main.py'] []\n", second.stderr
    assert server_pid(one_box) == pid  # the same server served both runs: the warm path was used


def test_a_run_cannot_reach_into_the_server(one_box):
    r = one_box.exec(code=(
        "import ctypes, os\n"
        "try:\n    open(f'/proc/{os.getppid()}/mem', 'rb').read(1)\nexcept OSError as e:\n    print('mem', e.errno)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('ptrace', libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())\n"))  # PTRACE_ATTACH
    assert r.ok, r.stderr
    assert r.stdout.startswith("mem 13\n") and r.stdout.splitlines()[1] == "ptrace -1 1", r.stdout  # EACCES, EPERM


def test_killing_the_server_costs_only_that_run(one_box):
    pid = server_pid(one_box)
    r = one_box.exec(code="import os, signal; os.kill(os.getppid(), signal.SIGKILL)\nimport time; time.sleep(5)")
    assert r.verdict == "error" and r.wall_s < 2
    after = one_box.exec(code="print('next')")
    assert after.stdout == "next\n" and server_pid(one_box) != pid


def test_sysv_ipc_left_behind_restarts_the_sandbox(one_box):
    pid = server_pid(one_box)
    r = one_box.exec(command=["python3", "-I", "-c", "pass"])  # cold path (not python3 -I FILE): no effect
    assert r.ok and server_pid(one_box) == pid
    leak = one_box.exec(code=(
        "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.shmget(0, 4096, 0o1600) >= 0)\n"))  # IPC_PRIVATE|IPC_CREAT
    assert leak.stdout == "True\n"
    assert one_box.exec(code="print(open('/proc/sysvipc/shm').read().count(chr(10)))").stdout == "1\n"
    assert server_pid(one_box) != pid


def test_a_timed_out_warm_run_reports_the_cpu_it_burnt(one_box):
    """Issue 29.6 on the warm path: the host killed the whole sandbox at the deadline, so the run's usage was lost
    and a busy loop reported 0 s of CPU; the run is now ended below the server, which reports its wait4 usage."""
    from infra.sandbox import Limits

    server_pid(one_box)  # the server is up: the run's clock does not include its start
    loop = ("import time\nmark = 0.0\nwhile True:\n    if time.process_time() - mark >= 0.1:\n"
            "        mark = time.process_time()\n        print(mark, flush=True)\n")
    r = one_box.exec(code=loop, limits=Limits(wall_s=1.5, cpu_s=10, memory_mb=512))
    seen = float(r.stdout.split()[-1])  # the CPU the program itself saw, last said before the deadline
    # wait4's usage may come in scheduler ticks (10 ms at HZ=100: a CI kernel reported 1.01 s for 1.015 s seen)
    assert r.verdict == "timeout" and seen - 0.011 <= r.cpu_s <= seen + 0.5 and r.max_rss_mb > 1, (seen, r)
    after = one_box.exec(code="print('next')")
    assert after.stdout == "next\n"  # a fresh sandbox serves the next run
