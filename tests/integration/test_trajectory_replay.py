"""Trajectories of multi-step episodes and ``temper replay``: a recorded scripted episode replays
equal in a fresh environment (a fresh sandbox box for file tasks); the same file with one recorded
observation tampered with replays as different, with a non-zero exit naming the turn."""

from __future__ import annotations

import json

import pytest

from infra.sandbox.bwrap import bwrap_available
from temper.agent import trajectories
from temper.data.catalog import load_catalog
from temper.data.generators import generate
from temper.verifiers.families.episode import episode_limits
from tests.conftest import REPO


def recorded(domain_name: str, n: int = 2) -> list[dict]:
    domain = load_catalog(REPO / "domains")[domain_name]
    params = domain.verifier.params
    out = []
    for record in generate(domain_name, n, 0, 0.1, {}).to_dict("records"):
        turns = json.loads(record["reference"])
        out.append(trajectories.record_episode(params.get("env", "files"), record, turns, episode_limits(params),
                                               domain_name))
    return out


def replay_cli(path, capsys) -> tuple[int, list[dict]]:
    from temper.cli import main

    code = main(["replay", str(path)])
    return code, [json.loads(x) for x in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("domain", [
    "ledger_tasks",
    pytest.param("file_tasks", marks=pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap")),
])
def test_a_recorded_episode_replays_equal_and_a_tampered_observation_is_reported(tmp_path, capsys, domain):
    episodes = recorded(domain)
    assert all(e["outcome"] == "done" and e["reward"] == 1.0 and len(e["turns"]) >= 2 for e in episodes)
    assert all(isinstance(t["t"], float) for e in episodes for t in e["turns"])  # timing recorded
    path = tmp_path / "trajectory.jsonl"
    trajectories.write(path, episodes)

    code, out = replay_cli(path, capsys)
    assert code == 0 and [r["result"] for r in out[:-1]] == ["equal", "equal"]
    assert out[-1] == {"summary": {"episodes": 2, "equal": 2, "different": 0}}

    tampered = json.loads(path.read_text().splitlines()[1])
    turn = next(t for t in tampered["turns"] if t["observation"])
    turn["observation"] = turn["observation"] + " (edited)"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], json.dumps(tampered)]) + "\n")
    code, out = replay_cli(path, capsys)
    assert code == 1 and [r["result"] for r in out[:-1]] == ["equal", "different"]
    assert out[1]["differences"] == [
        f"turn {turn['turn']} observation: recorded {trajectories._short(turn['observation'])}, "
        f"replayed {trajectories._short(turn['observation'][:-len(' (edited)')])}"]
    assert out[1]["reward"] == 1.0  # the episode itself still solves its task; the record is what changed


def test_a_changed_end_state_check_is_a_difference_too(tmp_path):
    """An episode recorded as solved whose replay no longer solves it (here: its expected end state
    edited after recording): same turns and observations, but the re-verified reward differs."""
    episode = recorded("ledger_tasks", 1)[0]
    accounts = json.loads(episode["record"]["end_accounts"])
    first = sorted(accounts)[0]
    accounts[first] = accounts[first] + 1
    episode["record"]["end_accounts"] = json.dumps(accounts)
    result = trajectories.replay(episode)
    assert not result.equal and result.differences == ["reward: recorded 1.0, replayed 0.0"]
