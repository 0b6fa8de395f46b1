"""A lane served by its own engine process (temper/rollout/lane_process.py): real processes, spawned, killed and
respawned here."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from temper.rollout.config import EngineConfig, LaneConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine, Finished
from temper.rollout.lane_process import usable_cpus
from temper.training.tiny import init_tiny

pytestmark = pytest.mark.skipif(usable_cpus() < 2, reason="a lane process needs a second CPU (engine.py)")

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
DOC = [5 + (i * 7) % 90 for i in range(300)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return init_tiny(tmp_path_factory.mktemp("lane") / "m", hidden=64, layers=2, heads=4, max_positions=1100, seed=0)


def _engine(model_dir, process: bool, long_chunk: int = 48, mixed: bool = True) -> Engine:
    lanes = [LaneConfig(name="short", max_prompt_tokens=64, prefill_chunk_tokens=32),
             LaneConfig(name="long", max_prompt_tokens=1000, prefill_chunk_tokens=long_chunk, own_process=process)]
    return Engine(EngineConfig(model_dir=model_dir, lanes=lanes, torch_threads=1, mixed_batches=mixed))


def _stream(e: Engine, prompt: list[int], params: SamplingParams) -> tuple[object, list, threading.Event]:
    events, done = [], threading.Event()

    def sink(ev):
        events.append(ev)
        if isinstance(ev, Finished):
            done.set()
    return e.submit([prompt], params, [sink])[0], events, done


def test_the_lane_process_serves_the_long_lane_with_the_engines_own_outputs_and_prefix_cache(model_dir):
    sampled = SamplingParams(max_tokens=6, temperature=0.9, n=2, seed=3, logprobs=True, stop=["zz"])
    runs = {}
    for process, mixed in ((False, True), (True, True), (True, False)):
        e = _engine(model_dir, process, mixed=mixed)
        try:
            first = e.generate([DOC + [9, 10, 11], [5, 6, 7]], GREEDY)
            second = e.generate([DOC + [12, 13]], GREEDY)  # shares the 300-token document with the first
            third = e.generate([DOC[:100] + [4]], sampled)
            e.generate([DOC[:90]], sampled.model_copy(update={"n": 1}))  # (warm: the same path as below)
            req, events, done = _stream(e, DOC[:90], sampled.model_copy(update={"n": 1}))
            if e._thread is None:
                e.run_until_idle()
            assert done.wait(30)
            streamed = ("".join(ev.text for ev in events[:-1]), [t for ev in events[:-1] for t in ev.token_ids],
                        {ev.request_id for ev in events}, req.id)
            runs[process, mixed] = (first + second + third, dict(e.counters), list(e.step_log),
                                    e.stats()["lane_processes"], streamed)
        finally:
            e.close()
    plain, plain_counts, _, none, plain_stream = runs[False, True]
    assert none == {}
    for key in ((True, True), (True, False)):
        split, counts, log, procs, stream = runs[key]
        assert procs["long"]["starts"] == 1 and procs["long"]["held"] == 0, key
        assert procs["long"]["prefilled_tokens"] == counts["lane_process_tokens"]
        assert [r.error for r in split] == [None] * 4
        # the same tokens, text, finish reasons and logprobs, seeded sampling included: only where they ran moved
        assert [[(s.token_ids, s.text, s.finish_reason) for s in r.samples] for r in split] == \
               [[(s.token_ids, s.text, s.finish_reason) for s in r.samples] for r in plain], key
        for got, want in zip(split[3].samples, plain[3].samples, strict=True):
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        # the second long prompt read the document from the lane process's prefix cache, as the engine's own
        assert split[2].cached_tokens == plain[2].cached_tokens == len(DOC)
        assert counts["lane_process_tokens"] == counts["prefill_tokens"] - 3 and plain_counts["lane_process_tokens"] == 0
        for name in ("prefill_tokens", "prompt_tokens", "prefix_hit_tokens", "group_shared_tokens", "decode_tokens"):
            assert counts[name] == plain_counts[name], (key, name)
        # no forward of the engine itself carried a long-lane request: its log has only what the process reported
        assert {ev.detail for ev in log if ev.lane == "long" and ev.kind != "finish"} == {"(lane process)"}
        # a stream relayed from the process: its deltas add up to the result, under this engine's request id
        assert stream[:2] == plain_stream[:2] and stream[2] == {stream[3]}


def test_a_killed_lane_process_fails_only_its_requests_and_the_next_one_respawns_it(model_dir):
    e = _engine(model_dir, True, long_chunk=1).start()  # one token per forward: slow enough to kill mid-prompt
    try:
        warm = e.generate([DOC[:40] + [1] * 30], GREEDY)[0]  # 70 tokens: the long lane; starts the process
        assert warm.error is None
        pid = e.stats()["lane_processes"]["long"]["pid"]
        req, events, done = _stream(e, DOC * 3 + [2], GREEDY)  # 901 one-token forwards: still running below
        short = e.generate([[5, 6, 7]], GREEDY, timeout_s=30)[0]  # the engine keeps serving meanwhile
        assert short.error is None and req.state == "elsewhere" and not done.is_set()
        os.kill(pid, signal.SIGKILL)
        assert done.wait(30)
        err = events[-1].error
        assert err is not None and "lane process" in err and f"pid {pid}" in err and "exited with code -9" in err
        again = e.generate([DOC[:40] + [1] * 30], GREEDY, timeout_s=60)[0]  # a new process
        assert again.error is None and again.token_ids == warm.token_ids
        stats = e.stats()["lane_processes"]["long"]
        assert stats["starts"] == 2 and stats["pid"] != pid and stats["held"] == 0
    finally:
        e.close()


def test_a_cancelled_request_leaves_the_lane_process_and_an_engine_over_a_live_model_serves_it_itself(model_dir):
    e = _engine(model_dir, True, long_chunk=1).start()
    try:
        e.generate([[1] * 70], GREEDY)
        req, events, done = _stream(e, DOC + [3], GREEDY)
        deadline = time.monotonic() + 30
        while req.state != "elsewhere" and time.monotonic() < deadline:
            time.sleep(0.01)
        e.cancel(req)
        assert done.wait(10) and events[-1].error == "cancelled"
        assert e.stats()["lane_processes"]["long"]["held"] == 0
        n_events = len(events)
        # the process was told to drop it; none of its late events reach the sink
        assert e.generate([[1] * 70], GREEDY, timeout_s=30)[0].error is None
        assert len(events) == n_events
    finally:
        e.close()
    live = Engine(e.config, model=e.model, tokenizer=e.tokenizer)  # weights that may change: no process copy
    try:
        assert live.lane_processes == {}
        assert live.generate([DOC + [9, 10, 11]], GREEDY)[0].error is None
        assert live.counters["lane_process_tokens"] == 0
    finally:
        live.close()


def test_the_lane_process_exits_when_the_engines_process_is_killed(model_dir, tmp_path):
    """A SIGKILLed server leaves no lane process behind (it would hold a core and a copy of the weights)."""
    script = tmp_path / "serve_once.py"
    script.write_text(f"""
import time
from temper.rollout.config import EngineConfig, LaneConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine
if __name__ == "__main__":
    lanes = [LaneConfig(name="short", max_prompt_tokens=64),
             LaneConfig(name="long", max_prompt_tokens=1000, own_process=True)]
    e = Engine(EngineConfig(model_dir={str(model_dir)!r}, lanes=lanes, torch_threads=1))
    assert e.generate([[5] * 80], SamplingParams(max_tokens=2, temperature=0.0))[0].error is None
    print(e.stats()["lane_processes"]["long"]["pid"], flush=True)
    time.sleep(600)
""")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([proc.stdout], [], [], 120)[0], "the engine did not start in 120 s"
        pid = int(proc.stdout.readline())
        os.kill(pid, 0)  # the lane process is alive
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        assert not _alive(pid), f"lane process {pid} outlived its engine's process"
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
