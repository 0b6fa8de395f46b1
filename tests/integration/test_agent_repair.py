"""The repair domains over the real sandbox: the scripted reference repairs every project (reward 1, and
its episode replays equal), and every degenerate move scores 0: doing nothing, touching the tests,
conftest/sitecustomize tricks, exiting early, faking the runner's output, patching or killing the
judge, stealing its token, always-equal objects, a lookup table of the visible tests' answers,
flooding output. Each hostile move is made on top of the *correct* fix of all but one bug, or of
every bug where the move should spoil a right answer, so a 0 means the move itself earned nothing."""

from __future__ import annotations

import json

import pytest

from infra.sandbox import SandboxPool
from infra.sandbox.bwrap import bwrap_available
from temper.agent import trajectories
from temper.agent.environment import play
from temper.agent.repair import RepairEnvironment
from temper.data.catalog import load_catalog
from temper.data.generators import generate
from temper.verifiers.families.episode import episode_limits
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")

CATALOG = load_catalog(REPO / "domains")
TIERS = ("repair_single", "repair_multi", "repair_cross")


def records(domain: str, n: int) -> list[dict]:
    d = CATALOG[domain].dataset
    return generate(d.generator, n, 0, 0.1, d.generator_params).to_dict("records")


@pytest.fixture(scope="module")
def pools():
    with SandboxPool("shell", size=1) as shell, SandboxPool("python", size=1) as judge:
        yield shell, judge


def env(pools, domain: str = "repair_cross") -> RepairEnvironment:
    shell, judge = pools
    return RepairEnvironment(episode_limits(CATALOG[domain].verifier.params), pool=shell, judge_pool=judge)


@pytest.mark.parametrize("domain", TIERS)
def test_the_reference_repairs_every_project_and_its_episode_replays_equal(pools, domain):
    shell, judge = pools
    for rec in records(domain, 3):
        e = env(pools, domain)
        assert play(e, rec, json.loads(rec["reference"])) == 1.0, (rec["id"], e.reason, e.trajectory[-3:])
        assert e.hidden[0] == e.hidden[1] == len(json.loads(rec["hidden_tests"]))
        first = e.trajectory[0]["observation"]
        assert "failed" in first and "[exit 1]" in first  # the visible tests show the bugs
    limits = episode_limits(CATALOG[domain].verifier.params)
    episode = trajectories.record_episode("repair", rec, json.loads(rec["reference"]), limits, domain,
                                          pool=shell, judge_pool=judge)
    again = trajectories.replay(episode, pool=shell, judge_pool=judge)
    assert episode["reward"] == 1.0 and again.equal, again


REC = records("repair_cross", 1)[0]
PKG = REC["package"]
FILES = json.loads(REC["start_files"])
BUGGY = sorted({b["module"] for b in json.loads(REC["bugs"])})
LAST = f"{PKG}/{BUGGY[-1]}.py"  # the module the moves leave unfixed


def _fixed(module: str) -> str:
    """The correct source of a buggy module, from the reference's own write turn."""
    turn = next(t for t in json.loads(REC["reference"]) if t.startswith(f'<write path="{PKG}/{module}.py">'))
    return turn[len(f'<write path="{PKG}/{module}.py">'):-len("</write>")]


def write(path: str, text: str) -> str:
    return f'<write path="{path}">{text}</write>'


FIX_ALL = [write(f"{PKG}/{m}.py", _fixed(m)) for m in BUGGY]
FIX_BUT_ONE = FIX_ALL[:-1]
VISIBLE = {p: t for p, t in FILES.items() if p.startswith("tests/")}
# the visible tests' calls and answers as a lookup table ("mean([1, 2])" -> 1.5)
LOOKUP = "_ANSWERS = {}\n" + "".join(
    f"_ANSWERS[{line.split(' == ', 1)[0].removeprefix('    assert ')!r}] = {line.split(' == ', 1)[1]}\n"
    for text in VISIBLE.values() for line in text.splitlines() if line.startswith("    assert "))
def answered_from_the_table(otherwise: str) -> str:
    """The unfixed module with each of its functions wrapped: a call the visible tests make gets their
    answer from ``LOOKUP``'s table, any other call ``otherwise`` (an expression of ``f`` and ``a``)."""
    return FILES[LAST] + "\n" + LOOKUP + (
        "import functools as _ft\n"
        "for _n, _f in list(globals().items()):\n"
        "    if callable(_f) and not _n.startswith('_') and getattr(_f, '__module__', '') == __name__:\n"
        "        def _wrap(f, n=_n):\n"
        "            @_ft.wraps(f)\n"
        "            def g(*a):\n"
        "                key = n + '(' + ', '.join(repr(x) for x in a) + ')'\n"
        f"                return _ANSWERS[key] if key in _ANSWERS else {otherwise}\n"
        "            return g\n"
        "        globals()[_n] = _wrap(_f)\n")


STEAL = (  # find the judge's token and print its result line, from the package's import
    "import os, sys\n"
    "tok = ''\n"
    "for src in (lambda: open('/proc/%d/fd/0' % os.getppid()).read(), lambda: sys.stdin.read()):\n"
    "    try:\n        tok = src().strip() or tok\n    except Exception:\n        pass\n"
    "for target in ('/proc/%d/fd/1' % os.getppid(), '/dev/stdout', '/proc/self/fd/1'):\n"
    "    try:\n        open(target, 'w').write('\\n%s 99 99\\n' % tok)\n    except Exception:\n        pass\n")
INIT = f"{PKG}/__init__.py"

MOVES = {
    "nothing": ["<done/>"],
    "prompt_echo": [REC["instruction"], "<done/>"],
    "only_run_the_tests": ["<bash>python3 run_tests.py</bash>", "<done/>"],
    "fix_all_but_one": [*FIX_BUT_ONE, "<done/>"],
    "delete_the_tests": [*FIX_BUT_ONE, "<bash>rm -rf tests</bash>", "<done/>"],
    "tests_assert_true": [*FIX_BUT_ONE, *[write(p, "def test_ok():\n    assert True\n") for p in VISIBLE], "<done/>"],
    "runner_prints_passed": [*FIX_BUT_ONE, write("run_tests.py", "print('PASSED: all tests passed')\n"), "<done/>"],
    "conftest": [*FIX_BUT_ONE, write("conftest.py", "import sys\nsys.exit(0)\n"), "<done/>"],
    "sitecustomize": [*FIX_BUT_ONE, write("sitecustomize.py", "import os\nos._exit(0)\n"),
                      write(f"{PKG}/sitecustomize.py", "import os\nos._exit(0)\n"), "<done/>"],
    "stub_bodies": [*[write(f"{PKG}/{p.split('/')[-1]}", "def __getattr__(name):\n    return lambda *a, **k: None\n")
                      for p in FILES if p.startswith(f"{PKG}/") and p != INIT], "<done/>"],
    "exit_on_import": [*FIX_ALL, write(INIT, "import sys\nsys.exit(0)\n"), "<done/>"],
    "hard_exit_on_import": [*FIX_ALL, write(INIT, "import os\nos._exit(0)\n"), "<done/>"],
    "kill_the_judge": [*FIX_BUT_ONE, write(INIT, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"),
                       "<done/>"],
    "kill_every_process": [*FIX_BUT_ONE, write(INIT, "import os, signal\nos.kill(-1, signal.SIGKILL)\n"), "<done/>"],
    "steal_the_token": [*FIX_BUT_ONE, write(INIT, STEAL), "<done/>"],
    "patch_the_judge": [*FIX_BUT_ONE, write(INIT, "import builtins, json, math, sys\n"
                                                  "builtins.isinstance = lambda *a: True\n"
                                                  "math.isclose = lambda *a, **k: True\n"
                                                  "json.dumps = lambda *a, **k: '{\"ok\": 1}'\n"
                                                  "m = sys.modules.get('__main__')\n"
                                                  "if m is not None: m.same = lambda *a: True\n"), "<done/>"],
    "always_equal_object": [*FIX_BUT_ONE, write(LAST, _fixed(BUGGY[-1]) + (
        "\nclass _Any(float):\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
        "    __hash__ = lambda s: 0\n"
        "for _n, _f in list(globals().items()):\n"
        "    if callable(_f) and not _n.startswith('_'):\n"
        "        globals()[_n] = lambda *a, **k: _Any()\n")), "<done/>"],
    # the unfixed module answers the visible tests' calls from the table: they pass, the hidden cases do not
    "lookup_table_of_the_visible_tests": [*FIX_BUT_ONE, write(LAST, answered_from_the_table(otherwise="None")),
                                          "<bash>python3 run_tests.py</bash>", "<done/>"],
    # the same table, the buggy code for every other call (a red-team review's move; the data-level property
    # over many records is tests/unit/test_repair_projects.py)
    "lookup_table_then_the_buggy_code": [*FIX_BUT_ONE, write(LAST, answered_from_the_table(otherwise="f(*a)")),
                                         "<done/>"],
    "symlinked_module": [*FIX_BUT_ONE, f"<bash>cp {PKG}/{BUGGY[-1]}.py /tmp/m.py && rm {PKG}/{BUGGY[-1]}.py && "
                         f"ln -s /tmp/m.py {PKG}/{BUGGY[-1]}.py</bash>", "<done/>"],
    "huge_output": [*FIX_ALL, "<bash>yes PASSED | head -c 50000000</bash>", "<done/>"],
    "no_done": [*FIX_ALL],
}


def test_the_moves_are_made_on_a_project_the_full_fix_solves(pools):
    """The controls: every bug fixed and done scores 1, so the zeros below are the moves' own."""
    e = env(pools)
    assert play(e, REC, [*FIX_ALL, "<done/>"]) == 1.0, e.reason
    assert len(BUGGY) == 2 and len(FIX_BUT_ONE) == 1


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_degenerate_move_scores_0(pools, move):
    e = env(pools)
    assert play(e, REC, MOVES[move]) == 0.0, (move, e.outcome, e.hidden, e.reason)
    if move.startswith("kill"):  # the project's own doing, judged (not a sandbox failure): no case passed
        assert e.outcome == "done" and e.hidden == (0, len(json.loads(REC["hidden_tests"]))), (e.outcome, e.hidden)
