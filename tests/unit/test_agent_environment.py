"""Multi-step environments without a sandbox: action parsing, the ledger API episode, the generated
tasks and their scripted reference policy, and the policies that must earn nothing."""

from __future__ import annotations

import json

import pytest

from temper.agent.environment import (
    MAX_CALL_CHARS,
    MAX_CALL_DEPTH,
    Action,
    EpisodeLimits,
    parse_action,
    parse_actions,
    play,
    render_action,
    summary_line,
)
from temper.agent.files import FilesEnvironment
from temper.agent.ledger import LedgerEnvironment
from temper.data.generators import generate
from temper.verifiers.registry import get_verifier

LEDGER = generate("ledger_tasks", 40, 0, 0.1, {}).to_dict("records")


def test_a_turn_parses_into_its_first_action_or_none():
    assert parse_action("I will list: <bash>ls -la</bash> then <done/>") == Action("bash", command="ls -la")
    assert parse_action('<write path="a/b.txt">x\ny</write>') == Action("write", path="a/b.txt", content="x\ny")
    assert parse_action('<call>{"name": "deposit", "arguments": {"account": "bob", "amount": 3}}</call>') == \
        Action("call", name="deposit", arguments={"account": "bob", "amount": 3})
    assert parse_action("all good <done />").kind == "done"
    for text in ["", "ls -la", "<bash>  </bash>", "<call>not json</call>", '<call>{"arguments": {}}</call>',
                 '<call>["deposit"]</call>', "PASSED", None]:
        assert parse_action(text) is None, text
    a = Action("call", name="transfer", arguments={"source": "a", "target": "b", "amount": 1})
    assert parse_action(render_action(a)) == a
    assert len(parse_actions("<done/> <bash>x</bash> <call>bad</call>")) == 3


def test_generation_is_deterministic_and_every_task_needs_several_steps():
    again = generate("ledger_tasks", 40, 0, 0.1, {}).to_dict("records")
    assert again == LEDGER
    for rec in LEDGER + generate("file_tasks", 40, 0, 0.1, {}).to_dict("records"):
        turns = json.loads(rec["reference"])
        assert len(turns) >= 3 and turns[-1] == "<done/>"  # at least two actions, then done


def test_reference_policy_solves_every_ledger_task_in_turns():
    env = LedgerEnvironment()
    for rec in LEDGER:
        turns = json.loads(rec["reference"])
        assert play(env, rec, turns) == 1.0, rec["id"]
        assert env.outcome == "done" and env.turns == len(turns)


def wrong_last_amount(rec):
    turns = json.loads(rec["reference"])
    call = json.loads(turns[-2][len("<call>"):-len("</call>")])
    if "amount" not in call["arguments"]:
        return None
    call["arguments"]["amount"] += 1
    return turns[:-2] + [f"<call>{json.dumps(call)}</call>", "<done/>"]


@pytest.mark.parametrize("policy", [
    lambda rec: [],  # says nothing
    lambda rec: [""],  # empty turn
    lambda rec: ["<done/>"],  # done at once
    lambda rec: [rec["instruction"]],  # echoes the task
    lambda rec: ["PASSED", "<done/>"],  # prints a pass
    lambda rec: ['<call>{"name": "_end_state_ok", "arguments": {}}</call>', "<done/>"],  # reaches for the checker
    lambda rec: ['<call>{"name": "__init__", "arguments": {"accounts": %s}}</call>' % rec["end_accounts"], "<done/>"],
    lambda rec: json.loads(rec["reference"])[:-1],  # does the work but never says done
    lambda rec: json.loads(rec["reference"])[:-2] + ["<done/>"],  # stops one call short
    wrong_last_amount,
], ids=["silent", "empty", "done-at-once", "echo", "passed", "checker", "init", "never-done", "short", "off-by-one"])
def test_degenerate_ledger_policies_score_zero(policy):
    env = LedgerEnvironment()
    scored = 0
    for rec in LEDGER:
        turns = policy(rec)
        if turns is None:
            continue
        assert play(env, rec, turns) == 0.0, (rec["id"], turns, env.outcome)
        scored += 1
    assert scored >= 10


def test_episode_limits_end_episodes_with_counted_outcomes():
    rec = LEDGER[0]
    env = LedgerEnvironment(EpisodeLimits(max_turns=2))
    env.reset(**rec)
    env.step('<call>{"name": "list_accounts", "arguments": {}}</call>')
    env.step('<call>{"name": "list_accounts", "arguments": {}}</call>')
    assert env.finished and env.outcome == "max_turns" and env.get_reward() == 0.0
    assert env.step("<done/>") == ""  # nothing happens after the end

    env = LedgerEnvironment(EpisodeLimits(budget_s=0.05))
    env.reset(**rec)
    env.started -= 1.0  # the episode's wall clock is spent (generation counts too)
    env.step('<call>{"name": "list_accounts", "arguments": {}}</call>')
    assert env.outcome == "budget" and env.get_reward() == 0.0

    env = LedgerEnvironment()
    env.reset(**rec)
    assert "unknown tool" in env.step('<call>{"name": "drop_table", "arguments": {}}</call>')
    assert "error" in env.step('<call>{"name": "deposit", "arguments": {"account": "nobody", "amount": -5}}</call>')
    assert not env.finished  # a bad call is an observation, the model may recover
    env.step("I think I am finished")
    assert env.outcome == "no_action" and env.get_reward() == 0.0


def test_past_the_history_budget_each_observation_is_its_summary_line_and_replays_the_same():
    """The policy for a history that would outgrow the context (``EpisodeLimits.history_chars``): the first
    observations in full while the budget lasts, every later one as its summary line; the episode's outcome
    and reward are its own, and a replay of its trajectory shows the same text."""
    from temper.agent import trajectories

    record = LEDGER[0]
    turns = ['<call>{"name": "audit", "arguments": {}}</call>'] * 6 + json.loads(record["reference"])  # errors
    full = LedgerEnvironment(EpisodeLimits(max_turns=20))
    reward = play(full, record, turns)
    seen = [t["observation"] for t in full.trajectory]
    budget = len(seen[0]) + len(seen[1])  # exactly two observations fit
    limits = EpisodeLimits(max_turns=20, history_chars=budget)
    env = LedgerEnvironment(limits)
    assert play(env, record, turns) == reward == 1.0 and env.outcome == full.outcome == "done"
    got = [t["observation"] for t in env.trajectory]
    assert got[:2] == seen[:2]
    for full_text, cut in zip(seen[2:6], got[2:6]):  # the unknown-tool errors, each longer than its summary
        assert cut == f"[{len(full_text)} chars cut] {full_text.rsplit(chr(10), 1)[-1][:60]}", cut
    assert all(cut == summary_line(full_text) for full_text, cut in zip(seen[2:], got[2:]))
    assert env.shown == sum(map(len, got)) < sum(map(len, seen))
    again = trajectories.replay(trajectories.trajectory("ledger", limits, record, env, reward))
    assert again.equal, again.differences
    assert EpisodeLimits().history_chars == 0  # no budget unless a domain sets one


def test_episode_verifier_replays_a_transcript_as_one_episode():
    verifier = get_verifier("episode", {"env": "ledger", "max_turns": 8})
    rec = LEDGER[1]
    turns = json.loads(rec["reference"])
    assert verifier.score(rec, "\n".join(turns)).reward == 1.0
    assert verifier.score(rec, "\n".join(turns[:-1])).reward == 0.0  # no done
    assert verifier.score(rec, "<done/>").reward == 0.0
    assert verifier.score(rec, "").reward == 0.0
    with pytest.raises(ValueError, match="max_turns"):
        get_verifier("episode", {"env": "ledger", "max_turns": 0})


def nested(depth: int, opener: str = "[", inner: str = "") -> str:
    closer = {"[": "]", "{": "}"}
    if opener == "{":
        return '{"a":' * depth + (inner or "1") + "}" * depth
    return opener * depth + inner + closer[opener] * depth


@pytest.mark.parametrize("body, reason", [
    (nested(3000), f"nested deeper than {MAX_CALL_DEPTH} levels"),  # the turn
    (nested(100_000), f"longer than {MAX_CALL_CHARS} characters"),
    (nested(1500, "{"), f"nested deeper than {MAX_CALL_DEPTH} levels"),
    ('{"name": "deposit", "arguments": ' + nested(1500, "{") + "}", f"nested deeper than {MAX_CALL_DEPTH} levels"),
    ('[{"a":' * 1200 + "1" + "}]" * 1200, f"nested deeper than {MAX_CALL_DEPTH} levels"),
    (nested(MAX_CALL_DEPTH + 1), f"nested deeper than {MAX_CALL_DEPTH} levels"),  # one past the bound
    ("[" * 3000, f"nested deeper than {MAX_CALL_DEPTH} levels"),  # never closed
    ('{"name": "list_accounts", "arguments": {"pad": "' + "x" * MAX_CALL_CHARS + '"}}',
     f"longer than {MAX_CALL_CHARS} characters"),
], ids=["brackets", "huge-brackets", "objects", "in-arguments", "mixed", "depth+1", "unclosed", "long"])
@pytest.mark.parametrize("make_env", [LedgerEnvironment, lambda: FilesEnvironment(pool=object())], ids=["ledger", "files"])
def test_a_deep_or_huge_call_ends_the_episode_with_its_reason_and_never_raises(make_env, body, reason):
    env = make_env()
    env.record, env.started = dict(LEDGER[0]), 0.0  # no sandbox needed: the turn is refused as it is parsed
    assert env.step(f"<call>{body}</call><done/>") == ""
    assert env.outcome == "no_action" and reason in env.reason
    assert env.get_reward() == 0.0


def test_calls_within_the_bounds_still_parse():
    deep = nested(MAX_CALL_DEPTH - 2, "{")  # the call's own object and its arguments are two levels
    assert parse_action(f'<call>{{"name": "x", "arguments": {{"a": {deep}}}}}</call>') is not None
    brackets = '"' + "[{" * 2000 + '\\\"]"'  # brackets inside a string (and an escaped quote) do not nest
    call = parse_action(f'<call>{{"name": "deposit", "arguments": {{"account": {brackets}}}}}</call>')
    assert call is not None and call.arguments["account"].startswith("[{[{")


def test_the_episode_verifier_scores_a_bracket_bomb_zero_with_its_reason():
    verifier = get_verifier("episode", {"env": "ledger", "max_turns": 8})
    verdict = verifier.score(LEDGER[0], "<call>" + nested(3000) + "</call><done/>")
    assert verdict.reward == 0.0 and verdict.details["reason"] == f"<call> nested deeper than {MAX_CALL_DEPTH} levels"


def test_the_episode_verifier_reads_a_multi_step_reference_as_its_turns():
    verifier = get_verifier("episode", {"env": "ledger", "max_turns": 8})
    for rec in LEDGER[:10]:
        transcript = verifier.reference_completion(rec)
        assert verifier.score(rec, transcript).reward == 1.0, rec["id"]
    for bad, message in [("not json", "'reference' is not JSON"), ('"<done/>"', "not a non-empty JSON list"),
                         ("[]", "not a non-empty JSON list"), ('["<done/>", 3]', "not a non-empty JSON list"),
                         ('["<bash>ls</bash> <done/>"]', "not exactly one action tag"),
                         ('["thinking", "<done/>"]', "not exactly one action tag")]:
        with pytest.raises(ValueError, match=message):
            verifier.reference_completion({**LEDGER[0], "reference": bad})
    with pytest.raises(ValueError, match="no string field 'reference'"):
        verifier.reference_completion({"instruction": "x"})
