"""The file_tasks environment over the real sandbox: the scripted reference policy solves every task,
degenerate and hostile policies earn nothing, bad input ends an episode with a counted outcome,
and nothing an episode leaves behind reaches the next one."""

from __future__ import annotations

import json

import pytest

from infra.sandbox import SandboxPool
from infra.sandbox.bwrap import bwrap_available
from temper.agent.environment import EpisodeLimits, play
from temper.agent.files import FilesEnvironment
from temper.data.generators import generate
from temper.verifiers.registry import get_verifier

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")

TASKS = generate("file_tasks", 12, 0, 0.1, {}).to_dict("records")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool("shell", size=1) as p:
        yield p


def env(pool, **limits):
    return FilesEnvironment(EpisodeLimits(**{"step_timeout_s": 3.0, "max_observation_chars": 300, **limits}), pool=pool)


def test_reference_policy_solves_every_task(pool):
    e = env(pool)
    for rec in TASKS:
        assert play(e, rec, json.loads(rec["reference"])) == 1.0, (rec["id"], e.trajectory)
        assert e.outcome == "done"
    assert pool._idle.qsize() == pool.size + pool.spare  # every box went back


def expected_via_shell(rec):
    """Reach the end state with one big shell turn that writes the files itself (a legitimate solution)."""
    script = "find . -mindepth 1 -delete; " + "; ".join(
        f"mkdir -p \"$(dirname {p})\"; printf '%b' {json.dumps(c)} > {p}" for p, c in json.loads(rec["end_files"]).items())
    return [f"<bash>{script}</bash>", "<done/>"]


@pytest.mark.parametrize("policy", [
    lambda rec: ["<done/>"],  # done at once
    lambda rec: [""],  # empty turn
    lambda rec: [rec["instruction"], "<done/>"],  # echoes the task
    lambda rec: ["<bash>echo PASSED; echo 1.0; exit 0</bash>", "<done/>"],  # prints a pass
    lambda rec: json.loads(rec["reference"])[:-2] + ["<done/>"],  # one action short
    lambda rec: json.loads(rec["reference"])[:-1],  # all the work, never says done
    lambda rec: json.loads(rec["reference"])[:-1] + ["<bash>echo extra > stray.txt</bash>", "<done/>"],  # a file too many
    lambda rec: json.loads(rec["reference"])[:-1] + [  # the right files, but one as a symlink
        "<bash>f=$(find . -type f | head -1); cp $f /tmp/x && rm $f && ln -s /tmp/x $f</bash>", "<done/>"],
    lambda rec: ['<write path="../../../tmp/state.json">{}</write>', '<write path="/etc/checker">ok</write>',
                 "<bash>export TEMPER_REWARD=1; alias test=true</bash>", "<done/>"],  # reaches for the checker
], ids=["done-at-once", "empty", "echo", "passed", "short", "never-done", "extra-file", "symlink", "checker"])
def test_degenerate_and_hostile_policies_score_zero(pool, policy):
    e = env(pool)
    for rec in TASKS[:4]:
        assert play(e, rec, policy(rec)) == 0.0, (rec["id"], e.outcome, e.trajectory)


def test_a_whole_plan_in_one_turn_is_a_solution_too(pool):
    assert play(env(pool), TASKS[0], expected_via_shell(TASKS[0])) == 1.0


def test_bad_input_ends_the_episode_with_a_counted_outcome(pool):
    rec = TASKS[0]
    cases = {
        "timeout": ["<bash>sleep 60</bash>", "<done/>"],  # an action that hangs
        "no_action": ["let me think about it"],  # a turn that parses into no action
        "max_turns": ["<bash>ls</bash>"] * 3,  # never says done
    }
    for outcome, turns in cases.items():
        e = env(pool, max_turns=3)
        assert play(e, rec, turns) == 0.0
        assert e.outcome == outcome, (outcome, e.trajectory)
    # huge output: the sandbox caps it (output_limit) and the observation the model sees stays short
    e = env(pool)
    e.reset(**rec)
    obs = e.step("<bash>yes 0123456789 | head -c 50000000</bash>")
    assert e.outcome == "output_limit" and len(obs) < 600 and e.get_reward() == 0.0
    # a sandbox that dies mid-episode
    e = env(pool)
    e.reset(**rec)
    e.session.box.close()
    e.step("<bash>ls</bash>")
    assert e.outcome == "sandbox_error" and e.get_reward() == 0.0
    # the pool replaced the dead box and the next episode works
    assert play(env(pool), rec, json.loads(rec["reference"])) == 1.0


def test_nothing_leaks_from_one_episode_into_the_next(pool):
    first, second = TASKS[0], TASKS[1]
    e = env(pool)
    e.reset(**first)
    e.step("<bash>echo secret > leak.txt; echo secret > /tmp/leak; mkdir -p .hidden && touch .hidden/x; "
           "(sleep 30 &) ; export LEAK=1</bash>")
    e.get_reward()  # ends the episode, gives the box back
    e.reset(**second)
    listing = e.step("<bash>ls -A</bash>")
    assert sorted(listing.split("\n")[:-1]) == sorted(json.loads(second["start_files"]))  # its own start state only
    assert e.step("<bash>cat /tmp/leak leak.txt 2>/dev/null; echo \"[$LEAK]\"</bash>") == "[]\n[exit 0]"
    assert e.step("<bash>pgrep -c sleep || true</bash>") == "0\n[exit 0]"
    assert e.get_reward() == 0.0  # and the episode itself is judged on its own
    e.close()


def test_episode_verifier_scores_a_transcript_in_the_sandbox(pool):
    verifier = get_verifier("episode", {"env": "files", "max_turns": 8, "step_timeout_s": 3})
    rec = TASKS[2]
    assert verifier.score(rec, "\n".join(json.loads(rec["reference"]))).reward == 1.0
    assert verifier.score(rec, "<bash>true</bash><done/>").reward == 0.0


@pytest.mark.parametrize("turn, reason", [
    # 1 GiB of sparse files in 8 KiB of disk: refused by apparent size, nothing read
    ("for i in $(seq 16); do truncate -s 63M .s$i; done", "'.s1' brings the files to more than 4000000 bytes"),
    ("truncate -s 5M docs.txt", "'docs.txt' brings the files to more than 4000000 bytes"),
    ("mkdir many && cd many && touch $(seq 1200)", "more than 1000 files and directories"),
    ("mkdir -p $(printf 'd/%.0s' $(seq 20))", "is nested deeper than 16 directories"),
    ("mkfifo pipe", "'pipe' is a fifo"),
    ("ln -s /etc/passwd link", "'link' is a symlink"),
    ("f=$(find . -type f | head -1); ln $f $f.2", "is a hard link"),
], ids=["sparse", "big-sparse", "many-files", "deep", "fifo", "symlink", "hard-link"])
def test_the_end_state_check_reads_nothing_past_its_limits(pool, turn, reason):
    """Whatever the box holds, the check's memory is bounded: it is refused (reward 0, the reason
    said) from lstat alone, before any file is opened."""
    import tracemalloc

    e = env(pool, step_timeout_s=5.0)
    e.reset(**TASKS[0])
    assert e.step(f"<bash>{turn}</bash>").endswith("[exit 0]"), e.trajectory
    e.step("<done/>")
    tracemalloc.start()
    try:
        reward = e.get_reward()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reward == 0.0 and e.outcome == "done"  # the model's doing, not a sandbox failure
    assert reason in e.reason and "snapshot limits" in e.reason
    assert peak < 2 << 20, f"the check allocated {peak >> 20} MiB"
