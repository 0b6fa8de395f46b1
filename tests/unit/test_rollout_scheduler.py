"""Lanes and admission without a model: routing, 413/429 with the limit named, all-or-none admission,
and the time-share rule that keeps a long lane from taking more than its share while short work waits."""

from types import SimpleNamespace

import pytest

from temper.rollout.config import EngineConfig, LaneConfig, SpeculativeConfig
from temper.rollout.errors import PromptTooLong, QueueFull
from temper.rollout.scheduler import Scheduler

LANES = [LaneConfig(name="short", max_prompt_tokens=100, max_queued=2, max_running=1),
         LaneConfig(name="long", max_prompt_tokens=1000, max_queued=1, max_running=1, time_share=0.25)]


def req(i):
    return SimpleNamespace(id=f"r{i}", lane="")


def test_route_by_prompt_length_and_413_names_the_limit():
    s = Scheduler(LANES, max_context_tokens=1200)
    assert s.route(100, 10).name == "short" and s.route(101, 10).name == "long"
    with pytest.raises(PromptTooLong) as e:
        s.route(1001, 10)
    assert e.value.status_code == 413
    assert e.value.body()["error"]["limit"] == {"name": "max_prompt_tokens", "lane": "long", "value": 1000,
                                                "prompt_tokens": 1001, "param": "prompt"}
    with pytest.raises(PromptTooLong) as e:
        s.route(900, 301)
    assert e.value.limit["name"] == "max_context_tokens" and e.value.limit["value"] == 1200


def test_queue_full_is_429_and_admission_is_all_or_none():
    s = Scheduler(LANES, max_context_tokens=1200)
    s.admit([(req(0), 10, 5), (req(1), 10, 5)])  # r0 takes the free running slot, r1 waits
    with pytest.raises(QueueFull) as e:
        s.admit([(req(2), 10, 5), (req(3), 10, 5)])  # 1 + 2 waiting > max_queued 2
    assert e.value.status_code == 429 and e.value.limit == {"name": "max_queued", "lane": "short", "value": 2,
                                                            "queued": 1}
    assert s.depth()["short"] == {"queued": 2, "running": 0}
    s.admit([(req(4), 500, 5), (req(5), 500, 5)])
    with pytest.raises(QueueFull):
        s.admit([(req(6), 10, 5), (req(7), 500, 5)])  # the long lane is full: the short one is not admitted
    assert s.depth() == {"short": {"queued": 2, "running": 0}, "long": {"queued": 2, "running": 0}}
    s.promote()
    assert s.depth() == {"short": {"queued": 1, "running": 1}, "long": {"queued": 1, "running": 1}}
    s.admit([(req(8), 10, 5)])
    with pytest.raises(QueueFull):
        s.admit([(req(9), 10, 5)])


def test_promote_respects_max_running():
    s = Scheduler(LANES, max_context_tokens=1200)
    s.admit([(req(0), 10, 5), (req(1), 10, 5)])
    assert [r.id for r in s.promote()] == ["r0"]
    assert s.depth()["short"] == {"queued": 1, "running": 1}


def test_time_share_limits_the_long_lane_only_while_both_have_work():
    s = Scheduler(LANES, max_context_tokens=1200)
    short, long_ = s.by_name["short"], s.by_name["long"]
    s.admit([(req(0), 500, 5)])
    s.promote()
    assert s.lanes_to_run() == [long_]  # alone: runs every step
    s.charge(long_, 1.0)
    s.admit([(req(1), 10, 5)])
    s.promote()
    assert s.lanes_to_run() == [short, long_]  # contention starts now: counters were reset
    s.charge(short, 0.01)
    s.charge(long_, 0.04)
    runs = []
    for _ in range(40):  # each short step costs 0.01 s, each long step 0.04 s
        lanes = s.lanes_to_run()
        runs.append(long_ in lanes)
        for lane in lanes:
            s.charge(lane, 0.01 if lane is short else 0.04)
    long_time = 0.04 * (1 + sum(runs))
    short_time = 0.01 * 41
    assert long_time / (long_time + short_time) <= 0.25 + 0.04 / (long_time + short_time)
    assert 0 < sum(runs) < 40


def test_a_lane_served_elsewhere_neither_runs_nor_contends_for_time():
    lanes = [LANES[0].model_copy(update={"time_share": 0.5}), LANES[1]]
    s = Scheduler(lanes, max_context_tokens=1200)
    short = s.by_name["short"]
    s.admit([(req(0), 500, 5), (req(1), 10, 5)])
    s.promote()
    for _ in range(5):  # the short lane alone has work here: it runs every step, whatever it has used
        assert s.lanes_to_run(elsewhere=frozenset({"long"})) == [short]
        s.charge(short, 1.0)


def test_engine_config_rejects_unordered_lanes_and_a_draft_model_without_a_draft(tmp_path):
    with pytest.raises(ValueError, match="ordered"):
        EngineConfig(model_dir=tmp_path, lanes=list(reversed(LANES)))
    assert EngineConfig(model_dir=tmp_path, profile="fast").speculative.method == "prompt_lookup"
    with pytest.raises(ValueError, match="draft_model needs draft_dir"):
        EngineConfig(model_dir=tmp_path, profile="fast", speculative=SpeculativeConfig(method="draft_model"))
    with pytest.raises(ValueError, match="prompt_lookup takes no draft_dir"):
        SpeculativeConfig(draft_dir=tmp_path)


# -- mixed batches: what one forward carries ------------------------------------------------------
MIXED = [LaneConfig(name="short", max_prompt_tokens=100, max_running=8, prefill_chunk_tokens=64),
         LaneConfig(name="long", max_prompt_tokens=5000, max_running=2, prefill_chunk_tokens=32)]


def mreq(i, prompt_len, state="prefill", rows=0, start=0):
    return SimpleNamespace(id=f"m{i}", lane="", state=state, prompt=[start + i * 1000 + t for t in range(prompt_len)],
                           prefilled=0, active=list(range(rows)), cache=None)


def _admit(s, *reqs):
    s.admit([(r, len(r.prompt), 4) for r in reqs])
    s.promote()


def _simulate(s, budget, steps):
    """Run ``steps`` forwards of ``plan_forward`` as the engine would: a prefill chunk advances
    ``prefilled`` (and starts the request: a cache); a finished prompt decodes one row for 3 forwards."""
    plans = []
    for _ in range(steps):
        plan = s.plan_forward(budget)
        plans.append([(r.id, kind, n) for r, kind, n in plan])
        for r, kind, n in plan:
            if kind == "prefill":
                r.cache = r.cache or object()
                r.prefilled += n
                if r.prefilled == len(r.prompt):
                    r.state, r.active, r.left = "decode", [0], 3
            else:
                r.left -= 1
                if r.left == 0:
                    s.remove(r)
    return plans


def test_a_long_prefill_is_chunked_and_progresses_every_forward_beside_decodes():
    s = Scheduler(MIXED, max_context_tokens=6000)
    long_ = mreq(0, 320)
    _admit(s, long_)
    shorts = [mreq(i, 10, state="decode", rows=4) for i in (1, 2)]
    _admit(s, *shorts)
    for _ in range(10):
        plan = s.plan_forward(budget=48)
        assert [(r.id, k, n) for r, k, n in plan] == [("m1", "decode", 4), ("m2", "decode", 4), ("m0", "prefill", 32)]
        long_.prefilled += 32  # chunk by chunk: 320 tokens in 10 forwards, each beside both decodes
    assert long_.prefilled == 320


def test_decode_rows_are_never_held_back_by_the_budget():
    s = Scheduler(MIXED, max_context_tokens=6000)
    long_ = mreq(0, 3000)
    _admit(s, long_)
    shorts = [mreq(i, 10, state="decode", rows=8) for i in (1, 2, 3)]
    _admit(s, *shorts)
    plan = s.plan_forward(budget=16)  # 24 decode rows > budget: all decode anyway, the prefill waits
    assert [(r.id, k) for r, k, _ in plan] == [("m1", "decode"), ("m2", "decode"), ("m3", "decode")]
    plan = s.plan_forward(budget=40)  # 40 - 24 = 16 left for the long chunk (below its 32 quota)
    assert plan[-1][0] is long_ and plan[-1][1:] == ("prefill", 16)


def test_budget_goes_lane_by_lane_each_lane_capped_by_its_chunk():
    s = Scheduler(MIXED, max_context_tokens=6000)
    long_ = mreq(0, 3000)
    a, b = mreq(1, 50), mreq(2, 40)
    _admit(s, long_, a, b)
    plan = [(r.id, k, n) for r, k, n in s.plan_forward(budget=200)]
    # short lane first: a whole (50), then b gets what is left of the short lane's 64; then the long lane's 32
    assert plan == [("m1", "prefill", 50), ("m2", "prefill", 14), ("m0", "prefill", 32)]
    plan = [(r.id, k, n) for r, k, n in s.plan_forward(budget=60)]
    assert plan == [("m1", "prefill", 50), ("m2", "prefill", 10)]  # no room left: the long lane waits this once


def test_short_requests_wait_at_most_one_forward_between_tokens_while_a_long_prefill_runs():
    """Every short request is in every forward from admission to its end (prefill, then a decode row per
    forward), and so is the long prefill: neither waits for the other."""
    s = Scheduler(MIXED, max_context_tokens=6000)
    long_ = mreq(0, 4000)
    _admit(s, long_)
    plans = _simulate(s, budget=96, steps=2)
    _admit(s, *(mreq(i, 20) for i in (1, 2, 3)))
    plans += _simulate(s, budget=96, steps=5)
    long_chunk = ("m0", "prefill", 32)
    assert plans[2] == [("m1", "prefill", 20), ("m2", "prefill", 20), ("m3", "prefill", 20), long_chunk]
    for plan in plans[3:6]:  # each short decodes in every forward until done, beside the long prefill
        assert plan == [("m1", "decode", 1), ("m2", "decode", 1), ("m3", "decode", 1), long_chunk]
    assert plans[6] == [long_chunk]  # the shorts are done; the long prefill never stopped
    assert all(plan[-1] == long_chunk for plan in plans)


def test_a_request_sharing_a_prefix_with_one_ahead_starts_once_that_one_is_cached():
    s = Scheduler([LaneConfig(name="all", max_prompt_tokens=1000, prefill_chunk_tokens=300)], max_context_tokens=6000)
    doc = list(range(7, 207))  # a 200-token document two long requests read
    first, second = mreq(0, 0), mreq(1, 0)
    first.prompt, second.prompt = doc + [1, 2], doc + [3, 4]
    _admit(s, first, second)
    cached = {"n": 0}
    plans = []
    while first.state == "prefill":
        plan = s.plan_forward(budget=500, cached_prefix=lambda t: cached["n"])
        plans.append([r.id for r, _, _ in plan])
        first.cache = object()
        first.prefilled += plan[0][2]
        if first.prefilled == len(first.prompt):
            first.state, cached["n"] = "decode", len(doc)  # its KV is in the prefix cache now
    assert all(ids == ["m0"] for ids in plans)  # the second waited: its document comes from the cache
    first.active = [0]
    assert [r.id for r, k, _ in s.plan_forward(budget=500, cached_prefix=lambda t: cached["n"])] == ["m0", "m1"]
    unrelated = mreq(2, 30, start=50_000)
    s2 = Scheduler(MIXED, max_context_tokens=6000)
    _admit(s2, mreq(3, 30, start=90_000), unrelated)
    assert [r.id for r, _, _ in s2.plan_forward(budget=500)] == ["m3", "m2"]  # nothing shared: no wait


def test_requests_a_lane_process_serves_take_no_rows_and_no_budget():
    s = Scheduler(MIXED, max_context_tokens=6000)
    away, decoding, short = mreq(0, 300, state="elsewhere"), mreq(1, 300, state="elsewhere", rows=2), mreq(2, 50)
    _admit(s, away, decoding, short)
    assert [(r.id, k, n) for r, k, n in s.plan_forward(budget=64)] == [("m2", "prefill", 50)]
