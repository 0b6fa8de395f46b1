"""Every domain of the reasoning-gym pack can score its own references: a few generated rows of each
domain, their reference completions (``<answer>oracle</answer>``) through the domain's verifier, 1.0
for every one; and the answer-length gate still refuses outputs beyond what a row's data needs.

The scoring program is the verifier's own (its gate, its ``score.py``, its verdict parsing); it runs
in this interpreter instead of a sandbox, since the answers are the generator's own and ~1,000 sandbox
runs would cost minutes. Measured on 2 shared cores: ~25 s (generation ~11 s, the preload of every
scorer ~4 s, scoring ~6 s).
"""

from __future__ import annotations

import io
import json
import sys
import time
import types
from pathlib import Path

import pytest

from temper.data.catalog import load_catalog
from temper.verifiers import get_verifier
from temper.verifiers.families import reasoning_gym as rg

REPO = Path(__file__).resolve().parents[2]
ROWS = 3  # per domain: the first rows of its dataset (seed 0), as `temper data generate` writes them


class InProcessPool:
    """The pool interface ``ReasoningGymVerifier`` runs ``score.py`` through, in this interpreter: the
    fork server's preload module once, then each run with its own stdin and stdout."""

    def __init__(self) -> None:
        self.profile = rg.profile()
        self.preload = types.ModuleType("__temper_preload__")
        exec(compile(rg.PRELOAD, "<preload>", "exec"), self.preload.__dict__)
        self.runs = 0

    def exec(self, argv, files, limits, stdin):
        assert argv == ["python3", "-I", rg.SCORER_FILE]
        saved = sys.stdin, sys.stdout, sys.stderr, list(sys.path), sys.modules.get("__temper_preload__")
        sys.modules["__temper_preload__"] = self.preload
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin.decode()), io.StringIO(), io.StringIO()
        out, err = sys.stdout, sys.stderr
        start = time.perf_counter()
        try:
            exec(compile(files[rg.SCORER_FILE], rg.SCORER_FILE, "exec"), {"__name__": "__main__"})
        finally:
            sys.stdin, sys.stdout, sys.stderr, sys.path[:], pre = saved
            if pre is None:
                sys.modules.pop("__temper_preload__", None)
        self.runs += 1
        return types.SimpleNamespace(verdict="ok", stdout=out.getvalue(), stderr=err.getvalue(), exit_code=0,
                                     wall_s=time.perf_counter() - start)


@pytest.fixture(scope="module")
def pack_rows(tmp_path_factory):
    """(domain, rows) for every domain the shipped pack expands to."""
    from temper.data.packs_reasoning_gym import generate_many

    catalog = load_catalog(REPO / "domains")
    domains = sorted((d for d in catalog.values() if d._pack == "rg"), key=lambda d: d.name)
    out = tmp_path_factory.mktemp("rows")
    jobs = [{"domain": d.name, "task": d.dataset.generator_params["task"], "tier": d.dataset.generator_params["tier"],
             "rows": ROWS, "seed": d.dataset.seed, "eval_fraction": d.split.eval_fraction,
             "out": str(out / f"{d.name}.jsonl")} for d in domains]
    replies = generate_many(jobs, processes=2)
    assert all(r["ok"] for r in replies.values()), {k: v for k, v in replies.items() if not v["ok"]}
    return [(d, [json.loads(line) for line in (out / f"{d.name}.jsonl").read_text().splitlines()]) for d in domains]


@pytest.fixture(scope="module")
def pool():
    return InProcessPool()


def test_every_pack_domain_scores_its_own_references_1(pack_rows, pool, monkeypatch):
    monkeypatch.setattr(rg, "shared_pool", lambda name: pool)
    assert len(pack_rows) >= 300
    failed, scored, longest = [], 0, 0
    for domain, rows in pack_rows:
        verifier = get_verifier(domain.verifier.family, domain.verifier.params)
        for row in rows:
            verdict = verifier.score(row, row["reference"])
            scored += 1
            longest = max(longest, len(row["answer"]))
            if verdict is None or verdict.reward != 1.0:
                failed.append((row["id"], len(row["answer"]), None if verdict is None else verdict.details))
    assert not failed, failed
    assert scored == pool.runs == ROWS * len(pack_rows)  # every reference reached the scorer: none was gated
    assert longest > 10_000  # the class this guards: oracles far over the old fixed 4000-char limit


def test_answers_beyond_what_the_row_needs_still_score_0_without_running(pack_rows, pool, monkeypatch):
    monkeypatch.setattr(rg, "shared_pool", lambda name: pool)
    runs = pool.runs
    by_length = sorted(((len(r["answer"]), d, r) for d, rows in pack_rows for r in rows), key=lambda t: t[0])
    for _, domain, row in (by_length[0], by_length[len(by_length) // 2], by_length[-1]):
        verifier = get_verifier(domain.verifier.family, domain.verifier.params)
        limit = max(domain.verifier.params["max_answer_chars"],
                    int(domain.verifier.params["oracle_length_factor"] * len(row["answer"])))
        padded = row["answer"] + " " * (limit - len(row["answer"])) + "x"  # one char over the limit
        verdict = verifier.score(row, f"<answer>{padded}</answer>")
        assert verdict.reward == 0.0 and verdict.details["reason"] == f"answer over {limit} chars", (row["id"], verdict)
        repeated = (row["answer"] + " ") * (10 * limit // (len(row["answer"]) + 1) + 1)  # the oracle, over and over
        huge = verifier.score(row, f"<answer>{repeated}</answer>")
        assert huge.reward == 0.0 and huge.details["reason"].startswith("answer over"), row["id"]
    assert pool.runs == runs  # refused at the gate: no scorer saw them
