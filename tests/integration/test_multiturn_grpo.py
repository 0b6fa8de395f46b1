"""Multi-turn GRPO through TRL's rollout_func: environment tokens carry no gradient.

A scripted policy stands in for the model's sampling (so the episodes really take several turns
and the group has one solved and one failed episode, hence non-zero advantages); the environment,
TRL's GRPOTrainer, its loss mask and its loss are the real ones.
"""

from __future__ import annotations

import json
import os

import pytest

from temper.data.catalog import load_catalog
from temper.data.generators import generate
from temper.training.multiturn import MultiTurnRollout, episode_reward
from tests.conftest import REPO

pytestmark = pytest.mark.slow


class ScriptedRollout(MultiTurnRollout):
    """Turn k of episode i is ``scripts[i % len(scripts)][k]`` ("<done/>" past its end), ending in EOS."""

    def __init__(self, *args, scripts, **kwargs):
        super().__init__(*args, **kwargs)
        self.scripts = scripts

    def _generate(self, model, trainer, tokenizer, active, max_new, eos):
        out = []
        for ep in active:
            script = self.scripts[ep["index"] % len(self.scripts)]
            k = ep["env"].turns
            text = script[k] if k < len(script) else "<done/>"
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"][: max_new - 1] + [tokenizer.eos_token_id])
        return out


def file_tasks(**params):
    """The catalog's ``file_tasks`` domain with these verifier params (turns, budgets, timeouts) over its own."""
    domain = load_catalog(REPO / "domains")["file_tasks"]
    return domain.model_copy(update={"verifier": domain.verifier.model_copy(
        update={"params": {**domain.verifier.params, **params}})})


def task_rows(domain, records: list[dict]) -> list[dict]:
    """The GRPO dataset rows of ``records`` (what the multi-turn rollout reads: prompt, domain, record)."""
    return [{"prompt": domain.render_prompt(r), "domain": domain.name, "record": json.dumps(r)} for r in records]


def ledger_rows(n):
    domain = load_catalog(REPO / "domains")["ledger_tasks"]
    records = generate("ledger_tasks", n, 0, 0.1, {}).to_dict("records")
    return domain, records, task_rows(domain, records)


def trainer_for(tiny, rows, rollout, tmp_path, **config):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    config = {"output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 2, "num_generations": 2,
              "max_steps": 1, "max_completion_length": 1024, "beta": 0.0, "report_to": [], "use_cpu": True,
              "shuffle_dataset": False, "logging_steps": 1, **config}
    args = GRPOConfig(**config)
    return GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny), reward_funcs=[episode_reward], args=args,
                       train_dataset=Dataset.from_list(rows), processing_class=AutoTokenizer.from_pretrained(tiny),
                       rollout_func=rollout)


def test_environment_tokens_are_masked_out_of_the_loss_and_get_zero_gradient(tiny_model, tmp_path):
    import torch

    domain, records, rows = ledger_rows(1)
    reference = json.loads(records[0]["reference"])
    wrong = ['<call>{"name": "list_accounts", "arguments": {}}</call>',
             '<call>{"name": "deposit", "arguments": {"account": "nobody", "amount": 1}}</call>', "<done/>"]
    rollout = ScriptedRollout([domain], rows, max_turn_tokens=200, scripts=[reference, wrong])
    trainer = trainer_for(tiny_model(max_positions=2048), rows, rollout, tmp_path)

    batch = next(iter(trainer.get_train_dataloader()))
    out = trainer._generate_and_score_completions(batch)
    episodes = rollout.last_episodes
    assert [e["reward"] for e in episodes] == [1.0, 0.0] and [e["outcome"] for e in episodes] == ["done", "done"]
    assert [e["turns"] for e in episodes] == [len(reference), len(wrong)]
    masks = [e["mask"] for e in episodes]
    assert all(0 in m and 1 in m for m in masks)  # model turns and observations interleave
    # the mask TRL trains with is exactly ours: observation tokens 0, sampled tokens 1
    for i, m in enumerate(masks):
        assert out["tool_mask"][i, : len(m)].tolist() == m
        assert (out["completion_mask"][i, : len(m)] * out["tool_mask"][i, : len(m)]).tolist() == m
    assert out["advantages"].abs().min() > 0

    def gradients(inputs):
        """d loss / d (final hidden state that predicts completion token j), per sample and token."""
        model = trainer.model
        model.zero_grad()
        captured = {}

        def keep(module, args, output):
            output.retain_grad()
            captured["h"] = output

        handle = model.model.norm.register_forward_hook(keep)
        try:
            trainer.compute_loss(model, inputs).backward()
        finally:
            handle.remove()
        width = inputs["prompt_ids"].shape[1]
        return captured["h"].grad[:, width - 1: -1].norm(dim=-1)  # position width-1+j predicts token j

    grad = gradients(out)
    for i, m in enumerate(masks):
        m = torch.tensor(m, dtype=torch.bool)
        assert torch.count_nonzero(grad[i, : len(m)][~m]) == 0  # observation tokens: exactly zero gradient
        assert torch.count_nonzero(grad[i, : len(m)][m]) == int(m.sum())  # every sampled token: some gradient
    # the check can fail: with the environment mask ignored, the same tokens do get gradient
    unmasked = {**out, "tool_mask": torch.ones_like(out["tool_mask"])}
    grad = gradients(unmasked)
    obs = ~torch.tensor(masks[0], dtype=torch.bool)
    assert torch.count_nonzero(grad[0, : len(masks[0])][obs]) > 0


def test_a_short_single_process_run_logs_per_domain_episode_metrics(tiny_model, tmp_path):
    domain, records, rows = ledger_rows(2)
    scripts = [json.loads(r["reference"]) for r in records] + [["no action here"]]
    rollout = ScriptedRollout([domain], rows, max_turn_tokens=200, scripts=scripts)
    trainer = trainer_for(tiny_model(max_positions=2048), rows, rollout, tmp_path, max_steps=2)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "episodes/ledger_tasks/turns_per_episode" in h]
    assert len(logged) == 2
    assert all(h["episodes/ledger_tasks/turns_per_episode"] >= 1 for h in logged)
    assert {"episodes/ledger_tasks/done_rate", "episodes/ledger_tasks/failure_rate",
            "episodes/ledger_tasks/reward", "episodes/ledger_tasks/wall_s"} <= set(logged[0])
    from temper.agent.environment import ENDINGS

    # every episode of a step is counted under exactly one ending (2 per step here, all "done")
    assert [sum(h[f"episodes/ledger_tasks/ended/{e}"] for e in ENDINGS) for h in logged] == [2, 2]
    assert [h["episodes/ledger_tasks/ended/done"] for h in logged] == [2, 2]
    # every episode was recorded as a trajectory, and a recorded one replays equal
    from temper.agent import trajectories

    recorded = trajectories.read(tmp_path / "out" / "trajectories" / "rank0.jsonl")
    assert [t["step"] for t in recorded] == [0, 0, 1, 1]
    assert {t["outcome"] for t in recorded} == {"done"} and 1.0 in {t["reward"] for t in recorded}
    assert [trajectories.replay(t).differences for t in recorded] == [[]] * 4


class SabotagedRollout(ScriptedRollout):
    """Episode 1's sandbox box is closed under it after its first turn (a sandbox dying mid-episode)."""

    def _generate(self, model, trainer, tokenizer, active, max_new, eos):
        for ep in active:
            if ep["index"] == 1 and ep["env"].turns == 1:
                ep["env"].session.box.close()
        return super()._generate(model, trainer, tokenizer, active, max_new, eos)


@pytest.mark.skipif(not __import__("infra.sandbox.bwrap", fromlist=["x"]).bwrap_available(), reason="needs bubblewrap")
@pytest.mark.parametrize("second", ["dies", "hangs"])
def test_a_dying_or_hanging_sandbox_fails_its_episode_not_the_step(tiny_model, tmp_path, second):
    import torch

    domain = file_tasks(step_timeout_s=1.0)
    records = generate("file_tasks", 1, 0, 0.1, {}).to_dict("records")
    rows = task_rows(domain, records)
    reference = json.loads(records[0]["reference"])
    scripts = [reference, ["<bash>ls</bash>", "<bash>ls</bash>", "<done/>"] if second == "dies"
               else ["<bash>ls</bash>", "<bash>sleep 30</bash>", "<done/>"]]
    cls = SabotagedRollout if second == "dies" else ScriptedRollout
    rollout = cls([domain], rows, max_turn_tokens=200, scripts=scripts)
    trainer = trainer_for(tiny_model(max_positions=2048), rows, rollout, tmp_path)
    out = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    episodes = rollout.last_episodes
    assert [e["outcome"] for e in episodes] == ["done", "sandbox_error" if second == "dies" else "timeout"]
    assert [e["reward"] for e in episodes] == [1.0, 0.0]  # the reference still solved its task in the sandbox
    assert episodes[1]["turns"] == 2 and episodes[1]["wall_s"] < 10
    assert torch.isfinite(trainer.compute_loss(trainer.model, out))  # and the step goes on


def test_a_mixed_run_gives_single_turn_samples_one_turn_and_their_own_verifier(tiny_model, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from temper.training.multiturn import rollout_for
    from temper.training.rewards import DomainRewards

    catalog = load_catalog(REPO / "domains")
    domains = [catalog["ledger_tasks"], catalog["arithmetic"]]
    rows = []
    for d in domains:
        for r in generate(d.dataset.generator, 1, 0, 0.1, {}).to_dict("records"):
            rows.append({"prompt": d.render_prompt(r), "domain": d.name, "record": json.dumps(r)})
    rollout = rollout_for(domains, rows)
    assert rollout_for([catalog["arithmetic"]], rows) is None  # no multi-step domain: TRL's own generation
    rewards = DomainRewards(domains)
    tiny = tiny_model(max_positions=2048)
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2, max_steps=1,
                      max_completion_length=64, beta=0.0, report_to=[], use_cpu=True, shuffle_dataset=False)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny), reward_funcs=[rewards], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=AutoTokenizer.from_pretrained(tiny),
                          rollout_func=rollout)
    out = trainer._generate_and_score_completions(next(iter(trainer.get_train_dataloader())))
    by_domain = {}
    for e in rollout.last_episodes:
        by_domain.setdefault(e["domain"], []).append(e)
    assert len(by_domain[None]) == len(by_domain["ledger_tasks"]) == 2
    assert all(e["turns"] == 1 and set(e["mask"]) == {1} for e in by_domain[None])  # one turn, all trained
    assert all(e["reward"] is None for e in by_domain[None])  # left to the domain's own verifier
    stats = rewards.summary()
    assert stats["arithmetic"]["n"] == 2 and stats["ledger_tasks"]["n"] == 2  # both scored, none skipped
    assert out["advantages"].shape[0] == 4


def test_a_resumed_run_redoes_the_killed_step_and_records_its_episodes_once(tiny_model, tmp_path):
    """A run killed in the middle of a GRPO step leaves, at most, the lines of steps after its checkpoint
    and a line cut short; the resumed process's first rollout drops them before it writes the redone step,
    so every step's episodes are in the trajectory file once and no half episode is."""
    from temper.agent import trajectories

    domain, records, rows = ledger_rows(1)
    scripts = [json.loads(records[0]["reference"]), ["no action here"]]
    killed = ScriptedRollout([domain], rows, max_turn_tokens=200, scripts=scripts)
    trainer = trainer_for(tiny_model(max_positions=2048), rows, killed, tmp_path)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer._generate_and_score_completions(batch)  # step 0's episodes, written by the attempt that dies
    path = tmp_path / "out" / "trajectories" / "rank0.jsonl"
    first = trajectories.read(path)
    assert [t["step"] for t in first] == [0, 0]
    with open(path, "a") as f:
        f.write(path.read_text().splitlines()[0][:200])  # the kill cut a write short

    resumed = ScriptedRollout([domain], rows, max_turn_tokens=200, scripts=scripts)  # the new process, at step 0
    trainer.rollout_func = resumed
    trainer._generate_and_score_completions(batch)
    again = trajectories.read(path)
    assert [t["step"] for t in again] == [0, 0] and [t["outcome"] for t in again] == [t["outcome"] for t in first]
    assert path.read_bytes().endswith(b"\n")
