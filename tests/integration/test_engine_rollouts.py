"""GRPO generation through the embedded rollout engine is on-policy: at every step of a short run
(tiny model, fp32, CPU) the engine's log-probability of each sampled token equals the trainer's own
recomputation with the policy being updated (TRL's ``_get_per_token_logps_and_entropies``) within
1e-4 nats. Without the weight sync the same check fails from the first optimizer step on.

Real pieces throughout: TRL's GRPOTrainer, its loss and optimizer, the engine (prefix cache,
grouped requests); only the rewards of the single-turn run and the environment of the multi-turn
run are simple test functions (the engine does not care where a reward comes from, and a random
model's turns would end a real domain's episode at its first, unparseable, turn).
"""

from __future__ import annotations

import json
import os

import pytest

from temper.data.catalog import load_catalog
from temper.data.generators import generate
from temper.training.multiturn import MultiTurnRollout, episode_reward
from tests.conftest import REPO
from tests.integration.conftest import run_grpo_with_worker

TOLERANCE = 1e-4  # nats per token


def varied_reward(prompts, completions, **_):
    """Rewards that differ within a group (digits and length), so advantages and updates are non-zero."""
    text = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) + 0.05 * len(t) for t in text]


def parity_trainer(tiny, rows, rollout, tmp_path, reward_funcs, **config):
    """A GRPOTrainer that, after each rollout, recomputes the sampled tokens' log-probabilities with its
    policy (TRL's own function, before this step's update) and records the largest gap to the engine's."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    class ParityTrainer(GRPOTrainer):
        parity: list[dict] = []

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            mask = out["completion_mask"] * out.get("tool_mask", torch.ones_like(out["completion_mask"]))
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            with torch.no_grad():
                logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention,
                                                                      out["completion_ids"].size(1))
            gap = (logps - out["sampling_per_token_logps"]).abs() * mask
            self.parity.append({"step": self.state.global_step, "max_gap": float(gap.max()),
                                "tokens": int(mask.sum())})
            return out

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    args = GRPOConfig(**{"output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4, "num_generations": 4,
                         "max_steps": 3, "max_completion_length": 16, "temperature": 0.8, "learning_rate": 1e-2,
                         "beta": 0.0, "report_to": [], "use_cpu": True, "bf16": False, "shuffle_dataset": False,
                         "logging_steps": 1, "save_strategy": "no", "seed": 0, **config})
    trainer = ParityTrainer(model=AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32),
                            reward_funcs=reward_funcs, args=args, train_dataset=Dataset.from_list(rows),
                            processing_class=AutoTokenizer.from_pretrained(tiny), rollout_func=rollout)
    trainer.parity = []
    return trainer


def arithmetic_rows(n):
    domain = load_catalog(REPO / "domains")["arithmetic"]
    records = generate(domain.dataset.generator, n, 0, 0.1, {}).to_dict("records")
    return domain, [{"prompt": domain.render_prompt(r), "domain": domain.name, "record": json.dumps(r)}
                    for r in records]


@pytest.mark.parametrize("sync", [True, False], ids=["synced", "unsynced"])
def test_single_turn_engine_logprobs_equal_the_trainers_at_every_step(tiny_model, tmp_path, sync):
    domain, rows = arithmetic_rows(2)  # 2 prompts, 3 steps: step 2 samples step 0's prompt again
    rollout = MultiTurnRollout([domain], rows, engine=True, engine_sync=sync)
    trainer = parity_trainer(tiny_model(), rows, rollout, tmp_path, [varied_reward])
    trainer.train()
    gaps = [p["max_gap"] for p in trainer.parity]
    assert [p["step"] for p in trainer.parity] == [0, 1, 2] and all(p["tokens"] > 0 for p in trainer.parity)
    engine = rollout.engine
    assert engine.engine.counters["requests"] == 3  # one request of n=4 per group: the prompt prefilled once
    # the prompt reuse logged per step: a group of G=4 is one prefill read by 4 samples, (G - 1) / G
    rates = [h["engine/prompt_hit_rate"] for h in trainer.state.log_history if "engine/prompt_hit_rate" in h]
    assert len(rates) == 3
    if sync:
        assert rates == [0.75] * 3  # the prefix cache is emptied at each sync: no reuse across steps
        assert max(gaps) < TOLERANCE, gaps
        assert engine.syncs == 3  # the initial copy + one after each optimizer step that a rollout followed
    else:  # the same run with a stale engine: parity holds before the first update and fails after it
        assert gaps[0] < TOLERANCE and min(gaps[1:]) > 100 * TOLERANCE, gaps
        # the cache is kept: step 1's prompt shares the domain's template with step 0's, and step 2's prompt
        # (step 0's again) comes from it whole but its last token
        assert rates[0] == 0.75 and 0.75 < rates[1] < rates[2] < 1.0
        assert engine.syncs == 1


class CountingEnvironment:
    """Any model turn is an action: the observation reports it, the episode ends after 3 turns; the
    reward counts digits in the turns (varies within a group)."""

    def __init__(self):
        self.outcome, self.turns, self.trajectory, self.digits = "running", 0, [], 0

    @property
    def finished(self):
        return self.outcome != "running"

    def reset(self, **record):
        return record["instruction"]

    def step(self, text):
        self.turns += 1
        self.digits += sum(ch.isdigit() for ch in text)
        if self.turns >= 3:
            self.outcome = "done"
            return ""
        return f"turn {self.turns}: {len(text)} chars"

    def get_reward(self):
        return float(self.digits)


class CountingRollout(MultiTurnRollout):
    def _environment(self, name, prompts):
        return CountingEnvironment()


def test_multi_turn_engine_logprobs_equal_the_trainers_across_turns_and_observations(tiny_model, tmp_path):
    catalog = load_catalog(REPO / "domains")
    domain = catalog["ledger_tasks"]
    domain = domain.model_copy(update={"verifier": domain.verifier.model_copy(
        update={"params": {**domain.verifier.params, "turn_tokens": 8}})})
    records = generate("ledger_tasks", 1, 0, 0.1, {}).to_dict("records")
    rows = [{"prompt": domain.render_prompt(r), "domain": domain.name, "record": json.dumps(r)} for r in records]
    rollout = CountingRollout([domain], rows, engine=True)
    trainer = parity_trainer(tiny_model(max_positions=2048), rows, rollout, tmp_path, [episode_reward],
                             max_steps=2, max_completion_length=96)
    trainer.train()
    assert [p["step"] for p in trainer.parity] == [0, 1]
    assert max(p["max_gap"] for p in trainer.parity) < TOLERANCE, trainer.parity
    episodes = rollout.last_episodes
    assert all(e["turns"] == 3 for e in episodes)
    assert all(0 in e["mask"] and 1 in e["mask"] for e in episodes)  # observations between sampled turns
    # turns 2 and 3 extend the episode's own history: the engine reused its KV from the prefix cache
    assert rollout.engine.engine.prefix_cache.stats()["hits"] > 0


@pytest.mark.slow
def test_two_rank_zero3_run_gathers_the_full_weights_into_each_ranks_engine_every_step(tmp_path, monkeypatch):
    """``temper train``'s own path (workloads.train, run.py, GRPOSettings.generation: engine) on 2 ZeRO-3
    ranks: each rank's engine gets the full parameters gathered from the shards after every step, and its
    log-probabilities equal the partitioned policy's own at every step on both ranks."""
    from temper.data.generators import generate_domain_dataset
    from temper.training.tiny import init_tiny
    from tests.conftest import use_embedded_home

    use_embedded_home(monkeypatch, tmp_path / "home")
    generate_domain_dataset(load_catalog(REPO / "domains")["arithmetic"])
    init_tiny(tmp_path / "tiny")
    out = tmp_path / "run"
    run_grpo_with_worker({"run_name": "engine", "domains": ["arithmetic"], "output_dir": str(out),
                          "base_model": str(tmp_path / "tiny"), "max_steps": 2, "export": False,
                          "per_device_batch_size": 2, "num_generations": 2, "max_completion_length": 12,
                          "learning_rate": 1e-2, "generation": "engine"},
                         tmp_path / "engine.yaml", "tests.integration.engine_parity_worker")
    for rank in (0, 1):
        rows = [json.loads(x) for x in (out / f"parity-rank{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1] and [r["syncs"] for r in rows] == [1, 2]
        assert all(r["tokens"] > 0 for r in rows)
        assert max(r["max_gap"] for r in rows) < TOLERANCE, rows
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["grad_norm"] > 0 for r in steps if "loss" in r] == [True] * 2  # the weights really moved
