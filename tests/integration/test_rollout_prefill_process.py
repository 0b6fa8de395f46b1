"""Disaggregated prefill (temper/rollout/prefill_worker.py): a lane's prompts are prefilled in a worker process
and decoded by the engine. Real processes: the worker is spawned, killed and respawned here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from temper.rollout.config import EngineConfig, LaneConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout import remote_prefill
from temper.rollout.engine import Engine, Finished
from temper.rollout.prefill_worker import usable_cpus
from temper.training.tiny import init_tiny

pytestmark = pytest.mark.skipif(usable_cpus() < 2, reason="the prefill worker needs a second CPU (engine.py)")

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
DOC = [5 + (i * 7) % 90 for i in range(300)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return init_tiny(tmp_path_factory.mktemp("prefill") / "m", hidden=64, layers=2, heads=4, max_positions=1100, seed=0)


def _engine(model_dir, process: bool, long_chunk: int = 48) -> Engine:
    lanes = [LaneConfig(name="short", max_prompt_tokens=64, prefill_chunk_tokens=32),
             LaneConfig(name="long", max_prompt_tokens=1000, prefill_chunk_tokens=long_chunk,
                        prefill_process=process)]
    return Engine(EngineConfig(model_dir=model_dir, lanes=lanes, torch_threads=1))


def test_the_worker_prefills_the_long_lane_with_the_engines_own_tokens_and_prefix_cache(model_dir):
    runs = {}
    for process in (False, True):
        e = _engine(model_dir, process)
        try:
            first = e.generate([DOC + [9, 10, 11], [5, 6, 7]], GREEDY)
            second = e.generate([DOC + [12, 13]], GREEDY)  # shares the 300-token document with the first
            runs[process] = (first + second, dict(e.counters), list(e.step_log), e.stats()["prefill_worker"])
        finally:
            e.close()
    (plain, plain_counts, _, no_worker), (split, counts, log, worker) = runs[False], runs[True]
    assert no_worker is None and worker["starts"] == 1
    assert [r.error for r in split] == [None] * 3
    assert [r.token_ids for r in split] == [r.token_ids for r in plain]  # same greedy tokens, prefilled elsewhere
    # the second long prompt read the document from the engine's prefix cache in both: the worker got its KV
    assert split[2].cached_tokens == plain[2].cached_tokens == len(DOC)
    assert counts["worker_prefill_tokens"] == (len(DOC) + 3) + 2 and plain_counts["worker_prefill_tokens"] == 0
    assert counts["prefill_tokens"] == plain_counts["prefill_tokens"]
    # no forward of the engine itself carried a long-lane prompt token: only the short prompt was prefilled there
    long_prefills = [ev for ev in log if ev.kind == "prefill" and ev.lane == "long"]
    assert long_prefills and all(ev.detail.endswith("(worker)") for ev in long_prefills)
    assert {ev.lane for ev in log if ev.kind == "prefill" and not ev.detail.endswith("(worker)")} == {"short"}


def test_a_killed_worker_fails_only_its_prompts_and_the_next_one_respawns_it(model_dir):
    e = _engine(model_dir, True, long_chunk=1).start()  # one token per worker forward: slow enough to kill
    try:
        warm = e.generate([DOC[:40] + [1] * 30], GREEDY)[0]  # 70 tokens: the long lane; starts the worker
        assert warm.error is None
        pid = e.stats()["prefill_worker"]["pid"]
        done, events = threading.Event(), []

        def sink(ev):
            events.append(ev)
            if isinstance(ev, Finished):
                done.set()
        req = e.submit([DOC + [2]], GREEDY, [sink])[0]
        short = e.generate([[5, 6, 7]], GREEDY, timeout_s=30)[0]  # the engine keeps serving meanwhile
        assert short.error is None and req.state == "prefill"
        deadline = time.monotonic() + 30
        while req.prefilled == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 0 < req.prefilled < len(req.prompt)
        os.kill(pid, signal.SIGKILL)
        assert done.wait(30)
        err = events[-1].error
        assert err is not None and "prefill worker" in err and f"pid {pid}" in err and "exited" in err
        again = e.generate([DOC[:40] + [1] * 30], GREEDY, timeout_s=60)[0]  # a new worker process
        assert again.error is None and again.token_ids == warm.token_ids
        stats = e.stats()["prefill_worker"]
        assert stats["starts"] == 2 and stats["pid"] != pid
    finally:
        e.close()


def test_a_cancelled_prompt_leaves_the_worker_and_an_engine_over_a_live_model_prefills_itself(model_dir):
    e = _engine(model_dir, True, long_chunk=1).start()
    try:
        e.generate([[1] * 70], GREEDY)
        req = e.submit([DOC + [3]], GREEDY, [lambda ev: None])[0]
        while req.prefilled == 0:
            time.sleep(0.01)
        e.cancel(req)
        deadline = time.monotonic() + 10
        while req.state != "done" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert req.state == "done" and not req.remote_prefill
        after = e.counters["worker_prefill_tokens"]
        time.sleep(0.3)  # the worker dropped the job: no more progress of it reaches the engine
        assert e.counters["worker_prefill_tokens"] == after
        assert e.generate([[1] * 70], GREEDY, timeout_s=30)[0].error is None
    finally:
        e.close()
    live = Engine(e.config, model=e.model, tokenizer=e.tokenizer)  # weights that may change: no worker copy
    try:
        assert live.remote is None
        assert live.generate([DOC + [9, 10, 11]], GREEDY)[0].error is None
        assert live.counters["worker_prefill_tokens"] == 0
    finally:
        live.close()


def test_a_prompt_whose_kv_does_not_fit_in_shared_memory_is_prefilled_by_the_engine(model_dir, monkeypatch, caplog):
    monkeypatch.setattr(remote_prefill, "shm_free_bytes", lambda: 4096)  # a full /dev/shm: 4 kB left
    e = _engine(model_dir, True)
    try:
        out = e.generate([DOC + [9, 10, 11]], GREEDY)[0]
        assert e.counters["worker_prefill_tokens"] == 0 and e.stats()["prefill_worker"]["starts"] == 0
    finally:
        e.close()
    plain = _engine(model_dir, False)
    try:
        assert out.error is None and out.token_ids == plain.generate([DOC + [9, 10, 11]], GREEDY)[0].token_ids
    finally:
        plain.close()
    assert "does not fit twice in /dev/shm" in caplog.text


def test_the_worker_exits_when_the_engines_process_is_killed(model_dir, tmp_path):
    """A SIGKILLed server leaves no prefill worker behind (it would hold a core and a copy of the weights)."""
    script = tmp_path / "serve_once.py"
    script.write_text(f"""
import time
from temper.rollout.config import EngineConfig, LaneConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine
if __name__ == "__main__":
    lanes = [LaneConfig(name="short", max_prompt_tokens=64),
             LaneConfig(name="long", max_prompt_tokens=1000, prefill_process=True)]
    e = Engine(EngineConfig(model_dir={str(model_dir)!r}, lanes=lanes, torch_threads=1))
    assert e.generate([[5] * 80], SamplingParams(max_tokens=2, temperature=0.0))[0].error is None
    print(e.stats()["prefill_worker"]["pid"], flush=True)
    time.sleep(600)
""")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        os.kill(pid, 0)  # the worker is alive
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        assert not _alive(pid), f"prefill worker {pid} outlived its engine's process"
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
