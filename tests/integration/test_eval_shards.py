"""Eval jobs over a set of domains: sharded processes give exactly the per-domain results of one process."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
from pathlib import Path

from temper.core.settings import with_job
from temper.training.tiny import init_tiny

pytestmark = pytest.mark.slow  # trains or runs whole benchmarks: `make test-fast` skips it


DOMAINS = ["arithmetic", "multiplication", "tool_calls"]


def _run(model: str, out: Path, index: int, count: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "workloads.evaluate", "--model", model, "--limit", "6", "--max-new-tokens", "4",
           "--out", str(out)] + [a for d in DOMAINS for a in ("--domain", d)]
    env = {**with_job(os.environ, shard_index=index, num_shards=count), "OMP_NUM_THREADS": "1"}  # as the flow's jobs
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_two_shards_split_the_domains_and_match_one_process(temper_home, tmp_path):
    from temper.cli import main

    assert main(["data", "generate", *[a for d in DOMAINS for a in ("--domain", d)]]) == 0
    model = str(init_tiny(tmp_path / "tiny"))
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    assert _run(model, whole, 0, 1).returncode == 0
    starts = []
    for i in range(2):
        proc = _run(model, sharded, i, 2)
        assert proc.returncode == 0, proc.stderr[-2000:]
        starts.append(json.loads(proc.stdout.splitlines()[0]))
    assert [s["domains"] for s in starts] == [2, 1]  # every 2nd of the sorted names: {arith, tool}, {mult}
    for d in DOMAINS:
        a, b = json.loads((whole / f"{d}.json").read_text()), json.loads((sharded / f"{d}.json").read_text())
        for key in ("wall_s",):
            a.pop(key), b.pop(key)
        assert a == b and a["n"] == 6


def test_a_bad_shard_index_is_refused(temper_home, tmp_path):
    proc = _run("unused", tmp_path / "out", 2, 2)
    assert proc.returncode != 0 and "shard index 2 is not in [0, 2)" in proc.stderr


def test_prompts_longer_than_the_context_are_not_generated_and_score_zero(temper_home, tmp_path):
    """A 512-position model is not asked to continue a 2,000-token prompt (that took 14 GB in a batch):
    such prompts get "" (reward 0) and are counted; prompts that fit are generated as before."""
    from workloads.evaluate import LocalGenerator

    gen = LocalGenerator(str(init_tiny(tmp_path / "tiny")))  # max_position_embeddings 512, one token per char
    out = gen(["3 + 4 =", "x" * 2000, "5 * 6 ="], 4)
    assert out[1] == "" and gen.too_long == 1
    assert out[0] == gen(["3 + 4 ="], 4)[0] and out[2] == gen(["5 * 6 ="], 4)[0]
