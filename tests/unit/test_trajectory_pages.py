"""Trajectory lines as readable pages, and the incremental reading the training callback samples from."""

from __future__ import annotations

import json

from temper.agent import trajectories
from temper.agent.environment import EpisodeLimits, play
from temper.agent.ledger import LedgerEnvironment
from temper.data.generators import generate


def _episode(turns, rid="r1"):
    record = generate("ledger_tasks", 1, 0, 0.1, {}).to_dict("records")[0]
    env = LedgerEnvironment(EpisodeLimits(max_observation_chars=400))
    reward = play(env, record, turns)
    return trajectories.trajectory("ledger", env.limits, record, env, reward, "ledger_tasks", id=rid, step=3)


def test_a_page_shows_the_task_each_turn_and_the_ending_with_long_observations_cut():
    record = generate("ledger_tasks", 1, 0, 0.1, {}).to_dict("records")[0]
    t = _episode(json.loads(record["reference"]))
    t["turns"][0]["observation"] = "x" * 5000
    page = trajectories.markdown(t, max_chars=100)
    assert page.startswith("# ledger_tasks episode: done, reward 1.0")
    assert "step 3" in page and "id r1" in page and record["instruction"][:50] in page
    assert page.count("## Turn ") == len(t["turns"]) and "ended: done" in page
    assert "x" * 100 in page and "x" * 101 not in page and "[... 4900 more chars]" in page
    assert trajectories.artifact_name(t, 3) == "ledger_tasks-03-done.md"


def test_new_lines_are_read_once_and_a_half_written_line_waits(tmp_path):
    path = tmp_path / "rank0.jsonl"
    assert trajectories.read_new(path, 0) == ([], 0)  # no file yet
    a, b = _episode(["<done/>"], "a"), _episode(["no action"], "b")
    trajectories.write(path, [a, b])
    lines, offset = trajectories.read_new(path, 0)
    assert [t["id"] for t in lines] == ["a", "b"] and offset == path.stat().st_size
    with open(path, "a") as f:
        f.write(json.dumps(_episode(["<done/>"], "c"))[:40])  # a writer mid-line
    assert trajectories.read_new(path, offset) == ([], offset)
    with open(path, "a") as f:  # ... and the rest of that line never came: the next one is read, the stub skipped
        f.write("\n" + json.dumps(_episode(["<done/>"], "d")) + "\n")
    more, end = trajectories.read_new(path, offset)
    assert [t["id"] for t in more] == ["d"] and end == path.stat().st_size
    assert [t["outcome"] for t in lines] == ["done", "no_action"]


def test_first_per_domain_keeps_the_first_k_of_each_domain_in_order():
    lines = [{"domain": d, "n": i} for i, d in enumerate("aabacbb")]
    assert [(t["domain"], t["n"]) for t in trajectories.first_per_domain(lines, 2)] == [
        ("a", 0), ("a", 1), ("b", 2), ("c", 4), ("b", 5)]
