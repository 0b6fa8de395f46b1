"""Agent episodes over sandbox sessions: stop reasons, budget, trajectory JSONL and replay."""

import pytest

from infra.sandbox import SandboxPool
from infra.sandbox.bwrap import bwrap_available
from temper.agent.episodes import ScriptedPolicy, TerminalEnv, load_episode, replay_episode, run_episode
from temper.data.generators import generate

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")

RECORD = {"id": "t1", "instruction": "Put the number of lines of data.txt into count.txt",
          "setup": "printf 'a\\nb\\nc\\n' > data.txt", "check": "test \"$(cat count.txt)\" = 3"}


@pytest.fixture(scope="module")
def pool():
    with SandboxPool("shell", size=1) as p:
        yield p


def test_episode_solves_task_with_state_across_steps(pool, tmp_path):
    policy = ScriptedPolicy(["mkdir scratch && cd scratch", "wc -l < ../data.txt > n", "cp n ../count.txt", "cat n"])
    ep = run_episode(policy, TerminalEnv(RECORD, pool), max_steps=8, trajectory=tmp_path / "ep.jsonl")
    assert ep.reward == 1.0 and ep.stop_reason == "policy" and len(ep.turns) == 4
    assert ep.turns[-1].observation == "3\n[exit 0]"
    loaded = load_episode(tmp_path / "ep.jsonl")
    assert [t.action for t in loaded.turns] == policy.actions and loaded.reward == 1.0
    assert replay_episode(tmp_path / "ep.jsonl", TerminalEnv(RECORD, pool)) == []
    assert pool._idle.qsize() == pool.size + pool.spare  # the box went back


def test_policy_sees_observations_and_limits_stop_it(pool):
    seen = []

    def policy(observation, history):
        seen.append(observation)
        return "ls; false"

    ep = run_episode(policy, TerminalEnv(RECORD, pool), max_steps=3)
    assert ep.stop_reason == "max_steps" and ep.reward == 0.0
    assert seen[0] == RECORD["instruction"] and seen[1] == "data.txt\n[exit 1]"
    ep = run_episode(ScriptedPolicy(["sleep 0.4"] * 10), TerminalEnv(RECORD, pool), max_steps=10, budget=1.0)
    assert ep.stop_reason == "budget" and 2 <= len(ep.turns) <= 3
    ep = run_episode(ScriptedPolicy(["sleep 30"]), TerminalEnv(RECORD, pool, step_timeout_s=0.5), max_steps=1)
    assert ep.turns[0].observation.endswith("[timeout]")


def test_replay_detects_a_changed_environment(pool, tmp_path):
    ep = run_episode(ScriptedPolicy(["cat data.txt"]), TerminalEnv(RECORD, pool), trajectory=tmp_path / "e.jsonl")
    changed = {**RECORD, "setup": "printf 'x\\n' > data.txt"}
    diffs = replay_episode(tmp_path / "e.jsonl", TerminalEnv(changed, pool))
    assert diffs and diffs[0]["recorded"] == ep.turns[0].observation and diffs[0]["replayed"] == "x\n[exit 0]"


def test_starter_shell_tasks_reference_solutions_as_episodes(pool):
    for rec in generate("shell_tasks", 3, 1, 0.1, {}).to_dict(orient="records"):
        assert run_episode(ScriptedPolicy([rec["reference"]]), TerminalEnv(rec, pool)).reward == 1.0
