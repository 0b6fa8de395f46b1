"""code_tests and terminal verifiers executing in the real bubblewrap sandbox."""

import asyncio
import time

import pytest

from infra.sandbox.bwrap import bwrap_available
from temper.data.formats.humaneval import load_humaneval
from temper.data.formats.nl2bash import to_records as nl2bash_records
from temper.data.generators import generate
from temper.verifiers import get_verifier

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def humaneval():
    return load_humaneval()


def test_all_humaneval_canonical_solutions_pass_and_wrong_ones_fail(humaneval):
    """164 real problems through the warm pool, gathered like a GRPO batch."""
    v = get_verifier("code_tests", {"timeout_s": 10})

    async def batch(completions):
        return await asyncio.gather(*(v.ascore(r, c) for r, c in zip(humaneval, completions)))

    start = time.monotonic()
    good = asyncio.run(batch([r["reference"] for r in humaneval]))
    elapsed = time.monotonic() - start
    failed = [(r["id"], g.details) for r, g in zip(humaneval, good) if g.reward != 1.0]
    assert failed == []
    assert elapsed < 30
    bad = asyncio.run(batch(["    return None\n"] * len(humaneval)))  # a few tests accept None for some asserts
    assert sum(b.reward == 1.0 for b in bad) == 0 and sum(b.reward for b in bad) / len(bad) < 0.2


def test_partial_credit_counts_asserts():
    rec = {"prompt": "def inc(x):\n", "entry_point": "inc",
           "test": "def check(candidate):\n    assert candidate(0) == 1\n    assert candidate(1) == 2\n"
                   "    assert candidate(-1) == 0\n    assert candidate(5) == 7\n"}
    body = "    return x + 1 if x < 3 else x\n"
    # a do-nothing body passes two of them: `return True` (True == 1) and `return 0`: they do not count
    got = get_verifier("code_tests", {"partial": True}).score(rec, body)
    assert got.reward == pytest.approx(0.5) and got.details["counted"] == 2, got.details
    assert get_verifier("code_tests").score(rec, body).reward == 0.0  # default: the benchmark's all-or-nothing


@pytest.mark.parametrize("hack", ["    import os; os._exit(0)\n", "    import sys; sys.exit(0)\n",
                                  "    print(open('main.py').read())\n    raise SystemExit(0)\n"])
def test_early_exit_does_not_fake_a_pass(hack):
    rec = generate("python_functions", 1, 0, 0.1, {}).iloc[0].to_dict()
    v = get_verifier("code_tests").score(rec, hack)
    assert v.reward == 0.0, v.details


def test_hostile_completion_is_zero_not_a_crash():
    rec = generate("python_functions", 1, 0, 0.1, {}).iloc[0].to_dict()
    start = time.monotonic()
    v = get_verifier("code_tests", {"timeout_s": 1}).score(rec, "    while True: pass\n")
    assert v.reward == 0.0 and v.details["verdict"] == "timeout" and time.monotonic() - start < 2
    v = get_verifier("code_tests", {"memory_mb": 300, "partial": False}).score(rec, "    x = bytearray(2**30)\n")
    assert v.reward == 0.0 and "MemoryError" in v.details["stderr"]  # the child's call fails, the harness reports it
    v = get_verifier("code_tests", {"memory_mb": 300, "partial": True}).score(rec, "    x = bytearray(2**30)\n")
    assert v.reward == 0.0 and v.details["passed"] == 0  # partial: each call's MemoryError fails its assert


def test_terminal_check_runs_in_a_clean_shell():
    records = generate("shell_tasks", 6, 0, 0.1, {}).to_dict(orient="records")
    v = get_verifier("terminal", {"timeout_s": 5})
    assert [v.score(r, r["reference"]).reward for r in records] == [1.0] * 6
    fake_path = "mkdir -p /work/.bin && printf '#!/bin/sh\\nexit 0\\n' > /work/.bin/test && chmod +x /work/.bin/test " \
                "&& cp /work/.bin/test /work/.bin/[ && export PATH=/work/.bin:$PATH"
    assert [v.score(r, fake_path).reward for r in records] == [0.0] * 6
    assert v.score({**records[0], "setup": "exit 1"}, records[0]["reference"]) is None


def test_terminal_output_mode_on_nl2bash_style_records():
    records = nl2bash_records([("count the lines with errors in logs/app.log", "grep -c error logs/app.log"),
                               ("list python files", "find . -name '*.py'")])
    v = get_verifier("terminal", {"mode": "output"})
    assert v.score(records[0], "grep error logs/app.log | wc -l").reward == 1.0
    assert v.score(records[0], "rm logs/app.log; echo 0").reward == 0.0
    assert v.score(records[1], "find src -name '*.py' | sed 's|^|./|'").reward == 1.0  # order-insensitive
    assert v.score(records[1], "ls").reward == 0.0


def test_grpo_reward_function_scores_a_mixed_batch_through_the_sandbox_concurrently():
    """What GRPOTrainer calls each step: DomainRewards over code (sandboxed) and arithmetic (in
    process) samples. Sleeping completions show the sandboxed ones overlap instead of queueing."""
    import json

    from temper.data.catalog import load_catalog
    from temper.training.rewards import DomainRewards
    from tests.conftest import REPO

    catalog = load_catalog(REPO / "domains")
    rewards = DomainRewards([catalog["python_functions"], catalog["arithmetic"]])
    code = generate("python_functions", 4, 3, 0.0, {}).to_dict(orient="records")
    once = "    if not globals().get('_slept'):\n        globals()['_slept'] = __import__('time').sleep(1.0) or 1\n"
    slow_right = [once + r["reference"] for r in code]  # the body sleeps 1 s on its first call only
    batch = [("python_functions", r, c) for r, c in zip(code, slow_right)]
    sums = {"question": "3 + 4", "answer": "7", "reference": "7"}
    batch += [("python_functions", code[0], "    return None\n"), ("arithmetic", sums, " 7"), ("arithmetic", sums, " 8")]
    call = dict(prompts=[""], completions=[code[0]["reference"]], domain=["python_functions"],
                record=[json.dumps(code[0])])
    assert rewards(**call) == [1.0]  # starts the shared sandbox pool (one box per core) outside the clock
    rewards.reset_stats()
    start = time.monotonic()
    out = rewards(prompts=[""] * len(batch), completions=[c for _, _, c in batch], domain=[d for d, _, _ in batch],
                  record=[json.dumps(r) for _, r, _ in batch])
    elapsed = time.monotonic() - start
    assert out[:4] == [1.0] * 4 and out[4] < 1.0 and out[5:] == [1.0, 0.0], out
    # serial: >= 4 s; with the pool's 2 boxes (2 cores here) the four sleeps take two rounds
    assert elapsed < 3.5, f"{elapsed:.2f}s: the four 1 s sandboxed samples ran one after another"
    assert rewards.summary()["python_functions"]["n"] == 5
