"""Warm pool scheduling and stateful sessions on the real bubblewrap backend."""

import asyncio
import time

import pytest

import infra.sandbox as sandbox
from infra.sandbox import Limits, PoolFull, QueueTimeout, SandboxError, SandboxPool, Session
from infra.sandbox.bwrap import bwrap_available
from infra.sandbox.session import load_steps, replay

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")


def test_cold_run_of_code_and_command():
    r = sandbox.exec(code="import sys; print(sys.argv, 6 * 7); sys.exit(3)")
    assert r.verdict == "ok" and r.exit_code == 3 and "42" in r.stdout and not r.ok
    r = sandbox.run("cat data.txt | tr a-z A-Z", files={"data.txt": "hello"}, profile="shell")
    assert r.ok and r.stdout == "HELLO"
    assert sandbox.run(["definitely-not-a-binary"]).exit_code != 0
    with pytest.raises(SandboxError, match="exactly one"):
        sandbox.run()
    with pytest.raises(SandboxError, match="unknown sandbox profile"):
        sandbox.run("true", profile="gpu")


def test_limits_are_validated_and_reported():
    with pytest.raises(ValueError):
        Limits(wall_s=0)
    r = sandbox.exec(code="x = bytearray(300 * 2**20)\nsum(range(10**6))", limits=Limits(memory_mb=1024))
    assert r.ok and r.max_rss_mb > 250 and r.cpu_s > 0


def test_pool_runs_concurrently_and_reclaims_boxes():
    with SandboxPool("python", size=2) as pool:
        start = time.monotonic()
        futs = [pool.submit(code="import time, os; open('mine', 'w'); time.sleep(0.5); print(sorted(os.listdir()))")
                for _ in range(4)]
        outs = [f.result().stdout for f in futs]
        elapsed = time.monotonic() - start
        assert outs == ["['main.py', 'mine']\n"] * 4  # no box saw another task's files
        assert 0.9 < elapsed < 1.9  # 4 x 0.5 s on 2 boxes: two rounds, not four
        assert pool.stats["runs"] == 4


def test_queue_deadline_and_back_pressure():
    with SandboxPool("python", size=1, max_queue=2) as pool:
        slow = [pool.submit(code="import time; time.sleep(0.6)", deadline_s=5) for _ in range(3)]
        with pytest.raises(PoolFull):
            pool.submit(code="pass")
        for f in slow:
            assert f.result().ok
        blocker = pool.submit(code="import time; time.sleep(1)")
        late = pool.submit(code="print('never')", deadline_s=0.3)
        with pytest.raises(QueueTimeout):
            late.result()
        assert blocker.result().ok and pool.stats["queue_timeouts"] == 1


def test_one_pool_serves_several_event_loops():
    """TRL calls asyncio.run per batch; the pool must not be tied to the first loop."""
    with SandboxPool("python", size=2) as pool:
        async def batch(n):
            return await asyncio.gather(*(pool.aexec(code=f"print({i} * 2)") for i in range(n)))

        for _ in range(2):
            assert [r.stdout for r in asyncio.run(batch(6))] == [f"{i * 2}\n" for i in range(6)]


def test_session_keeps_files_cwd_and_exports():
    with SandboxPool("shell", size=1) as pool, pool.lease() as box:
        s = Session(box, pool.profile.limits)
        assert s.run("mkdir -p a/b && cd a/b && export GREETING='hi there' && echo one > f").ok
        r = s.run('pwd; echo "$GREETING"; cat f')
        assert r.stdout == "/work/a/b\nhi there\none\n"
        assert s.run("exit 4").exit_code == 4 and s.shell.cwd == "/work/a/b"
        r = s.run("sleep 5", timeout=0.5)
        assert r.verdict == "timeout" and s.run("pwd").stdout == "/work/a/b\n"


def test_session_snapshot_restore_and_replay(tmp_path):
    with SandboxPool("shell", size=1) as pool:
        with pool.lease() as box:
            s = Session(box, pool.profile.limits)
            s.write_files({"n.txt": "1\n"})
            s.run("cd /work && export STEP=1")
            snap = s.snapshot()
            s.run("echo 2 >> n.txt; export STEP=2; mkdir gone && cd gone")
            s.restore(snap)
            assert s.run('cat n.txt; echo "$STEP"; pwd').stdout == "1\n1\n/work\n"
            s.save(tmp_path / "episode.jsonl")
        steps = [st for st in load_steps(tmp_path / "episode.jsonl") if st.action["kind"] != "restore"]
        with pool.lease() as box:
            assert replay(Session(box, pool.profile.limits), steps[:2]) == []
        steps[1].observation["exit_code"] = 9  # a tampered recording is caught
        with pool.lease() as box:
            diffs = replay(Session(box, pool.profile.limits), steps[:2])
        assert diffs and diffs[0]["exit_code"] == {"recorded": 9, "replayed": 0}


@pytest.mark.parametrize("program,stdin", [
    ("import sys; print(sys.argv, __file__, __name__, sys.flags.isolated, sys.path[0])", b""),
    ("import sys; print(sys.stdin.read().upper())", b"piped input"),
    ("1/0", b""),
    ("def f(:\n", b""),
    ("import sys; sys.exit('bye')", b""),
    ("import resource; print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_NPROC))", b""),
])
def test_warm_interpreter_behaves_like_a_fresh_python(program, stdin):
    """The warm pool runs code in an interpreter started ahead of time; users must not notice."""
    with SandboxPool("python", size=1, spare=0) as pool:
        warm = pool.exec(code=program, stdin=stdin)
    cold = sandbox.exec(code=program, stdin=stdin)
    assert (warm.stdout, warm.exit_code, warm.verdict) == (cold.stdout, cold.exit_code, cold.verdict)
    assert warm.stderr.splitlines()[-1:] == cold.stderr.splitlines()[-1:]
    assert warm.stderr.count("File ") == cold.stderr.count("File ")  # no extra traceback frame


def test_lowered_limits_apply_on_the_warm_path():
    with SandboxPool("python", size=1, spare=0) as pool:
        r = pool.exec(code="bytearray(400 * 2**20)", limits=pool.profile.limits.merged(memory_mb=200))
        assert r.verdict == "memory"
        missing = pool.exec(command=["python3", "-I", "nope.py"])
        assert missing.exit_code == 2 and "can't open file" in missing.stderr


def test_a_snapshot_is_bounded_by_default_and_refused_before_reading():
    """Session snapshots (replay, the programs family's output mode) read the work dir into the host
    too: sparse files past the default StateLimits are refused by apparent size, links kept as links."""
    import io
    import tarfile

    from infra.sandbox.api import StateLimitError
    from infra.sandbox.snapshot import StateLimits

    with SandboxPool("shell", size=1) as pool:
        with pool.lease() as box:
            assert box.run(["bash", "-c", "truncate -s 40M a b; ln -s a link"], pool.profile.limits).ok
            with pytest.raises(StateLimitError, match=r"over its snapshot limits: 'b' brings the files to more than 67108864"):
                box.snapshot()
            with tarfile.open(fileobj=io.BytesIO(box.snapshot(StateLimits(max_bytes=100 << 20)))) as tar:
                assert [(m.name, m.size, m.issym()) for m in tar] == [("a", 40 << 20, False), ("b", 40 << 20, False),
                                                                      ("link", 0, True)]
