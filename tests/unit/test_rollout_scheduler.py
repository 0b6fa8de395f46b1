"""Lanes and admission without a model: routing, 413/429 with the limit named, all-or-none admission,
and the time-share rule that keeps a long lane from taking more than its share while short work waits."""

from types import SimpleNamespace

import pytest

from temper.rollout.config import EngineConfig, LaneConfig
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


def test_engine_config_rejects_unordered_lanes_and_fast_without_draft(tmp_path):
    with pytest.raises(ValueError, match="ordered"):
        EngineConfig(model_dir=tmp_path, lanes=list(reversed(LANES)))
    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(model_dir=tmp_path, profile="fast")
