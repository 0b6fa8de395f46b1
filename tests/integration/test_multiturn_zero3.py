"""A short multi-turn GRPO run on 2 DeepSpeed ZeRO-3 ranks (gloo, CPU) with the tiny model, through
``workloads.train`` (run.py builds the GRPOTrainer with the multi-turn ``rollout_func``), both
multi-step domains, the real sandbox, and episodes of unequal length on the two ranks."""

from __future__ import annotations

import json

import pytest

from infra.sandbox.bwrap import bwrap_available
from tests.conftest import REPO, use_embedded_home
from tests.integration.conftest import run_grpo_with_worker

DOMAINS = ["file_tasks", "ledger_tasks"]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")]


def test_two_rank_multiturn_run_with_unequal_episodes_completes_and_logs_turns(tmp_path, monkeypatch):
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.training.tiny import init_tiny

    use_embedded_home(monkeypatch, tmp_path / "home")
    catalog = load_catalog(REPO / "domains")
    for name in DOMAINS:
        generate_domain_dataset(catalog[name])
    init_tiny(tmp_path / "tiny", max_positions=2048)

    out = tmp_path / "run"
    run_grpo_with_worker({"run_name": "mt", "domains": DOMAINS, "output_dir": str(out),
                          "base_model": str(tmp_path / "tiny"), "max_steps": 2, "per_device_batch_size": 2,
                          "num_generations": 2, "max_completion_length": 1024, "learning_rate": 1e-3},
                         tmp_path / "mt.yaml", "tests.integration.multiturn_worker")

    calls = {r: [json.loads(x) for x in (out / f"calls-rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert len(calls[0]) == len(calls[1]) == 2  # one rollout per step on each rank
    for a, b in zip(calls[0], calls[1]):
        assert a["generate_calls"] == 1 and b["generate_calls"] >= 3  # unequal lengths, no deadlock
        assert a["turns"] == [1, 1] and all(t >= 3 for t in b["turns"])
        assert a["rewards"] == [0.0, 0.0] and b["rewards"] == [1.0, 1.0]  # reference solves, in the real sandbox

    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in logged if "loss" in row]
    assert len(steps) == 2
    for row in steps:  # per-domain turns per episode, summed over both ranks, every step
        turns = {d: row.get(f"episodes/{d}/turns_per_episode") for d in DOMAINS}
        assert None not in turns.values(), sorted(row)
        assert min(turns.values()) == 1 and max(turns.values()) >= 3  # rank 0's one-turn and rank 1's long episodes
        assert {f"reward/{d}" for d in DOMAINS} <= set(row)  # DomainRewards counted the episodes' rewards
