"""Eval of a multi-step domain plays the episode turn by turn in its environment, as training does.

A scripted reference policy stands in for the model: it only ever says the *next* action of the
record's reference, chosen by how many observations its context already holds, so it solves a task
only when the eval really carries out one turn, shows the observation and asks again; the old
one-shot path (one completion's action tags played as turns) scores it 0. The environments, the
sandbox, the verifier and the MLflow records are the real ones.
"""

from __future__ import annotations

import json

import pytest

from infra.sandbox.bwrap import bwrap_available
from temper.agent.environment import ENDINGS
from temper.data.catalog import load_catalog
from temper.verifiers.registry import get_verifier
from tests.conftest import REPO
from tests.integration.conftest import generate


class ReferencePolicy:
    """Greedy 'model' of the eval: for the context of record r after k observations, r's k-th reference
    action (``<done/>`` past its end); ``override`` replaces a record's whole script (bad input)."""

    def __init__(self, domain, records, override=None):
        self.scripts = {domain.render_prompt(r): json.loads(r["reference"]) for r in records}
        for rid, script in (override or {}).items():
            (r,) = [r for r in records if r["id"] == rid]
            self.scripts[domain.render_prompt(r)] = script
        self.calls = 0

    def __call__(self, contexts, max_new_tokens):
        self.calls += 1
        out = []
        for context in contexts:
            (script,) = [s for p, s in self.scripts.items() if context.startswith(p)]
            k = context.count("\nObservation:\n")
            out.append(script[k] if k < len(script) else "<done/>")
        return out

    def close(self):
        pass


def _eval_records(domain, limit):
    from temper.core.settings import get_settings
    from temper.data.datasets import load_dataset

    frame = load_dataset(domain, get_settings()).frame
    return frame[frame[domain.split.column] == domain.split.eval].head(limit).to_dict(orient="records")


@pytest.mark.parametrize("name", ["ledger_tasks", pytest.param("file_tasks", marks=pytest.mark.skipif(
    not bwrap_available(), reason="needs bubblewrap"))])
def test_the_reference_policy_scores_1_through_the_eval_episode_loop_and_0_one_shot(tracked, name):
    from mlflow.tracking import MlflowClient

    from temper.lifecycle.evaluation import record_eval
    from workloads.evaluate import _evaluate

    generate(name)
    domain = load_catalog(REPO / "domains")[name]
    records = _eval_records(domain, 4)
    policy = ReferencePolicy(domain, records)
    result = _evaluate(policy, "scripted-reference", domain, limit=4, max_new_tokens=8, keep_samples=2)

    lengths = [len(json.loads(r["reference"])) for r in records]
    assert min(lengths) > 1  # every task needs several steps
    assert result.rewards == [1.0] * 4 and result.mean_reward == 1.0 and result.outcomes == ["done"] * 4
    assert result.turns == lengths
    # one generate call per round of turns for all running episodes (file_tasks: in waves of the pool's boxes)
    assert policy.calls == max(lengths) if name == "ledger_tasks" else policy.calls >= max(lengths)
    # the old path, one greedy completion's action tags played as turns, gets one action and scores 0
    verifier = get_verifier(domain.verifier.family, domain.verifier.params)
    one_shot = [verifier.score(r, policy([domain.render_prompt(r)], 8)[0]).reward for r in records]
    assert one_shot == [0.0] * 4

    # recorded: per-sample turns and outcome, episode metrics, trajectories as readable pages
    client = MlflowClient(tracked)
    parent = client.create_run(client.create_experiment(f"eval-episodes-{name}")).info.run_id
    run_id = record_eval(result.to_dict() | {"model": "scripted-reference"}, "candidate", parent,
                         experiment=f"eval-episodes-{name}")
    metrics = client.get_run(run_id).data.metrics
    assert metrics["turns_per_episode"] == sum(lengths) / 4 and metrics["ended_done"] == 4.0
    assert metrics["ended_no_action"] == 0.0 and metrics["episode_wall_s"] > 0
    import mlflow

    samples = [json.loads(x) for x in mlflow.artifacts.load_text(f"runs:/{run_id}/eval/{name}.jsonl").splitlines()]
    assert [(s["turns"], s["outcome"]) for s in samples] == [(n, "done") for n in lengths]
    pages = [a.path for a in client.list_artifacts(run_id, f"trajectories/{name}")]
    assert len(pages) == 4 and all(p.endswith("-done.md") for p in pages)
    page = mlflow.artifacts.load_text(f"runs:/{run_id}/{pages[0]}")
    assert "## Turn 2" in page and "Observation:" in page and "reward 1.0" in page
    lines = mlflow.artifacts.load_text(f"runs:/{run_id}/eval/{name}-trajectories.jsonl").splitlines()
    from temper.agent import trajectories

    assert trajectories.replay(json.loads(lines[0])).equal  # an eval episode replays like a training one


@pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap")
def test_a_hanging_action_and_a_turn_without_action_end_their_eval_episodes_counted(temper_home):
    from workloads.evaluate import _evaluate

    generate("file_tasks")
    domain = load_catalog(REPO / "domains")["file_tasks"]
    domain = domain.model_copy(update={"verifier": domain.verifier.model_copy(
        update={"params": {**domain.verifier.params, "step_timeout_s": 1.0}})})
    records = _eval_records(domain, 3)
    policy = ReferencePolicy(domain, records, override={records[1]["id"]: ["<bash>sleep 60</bash>"],
                                                        records[2]["id"]: ["I would list the files"]})
    result = _evaluate(policy, "scripted", domain, limit=3, max_new_tokens=8, keep_samples=0)
    assert result.outcomes == ["done", "timeout", "no_action"] and result.rewards == [1.0, 0.0, 0.0]
    assert result.trajectories[1]["wall_s"] < 20  # the 1 s step timeout, not the 60 s sleep


@pytest.mark.slow
def test_the_tiny_models_eval_of_a_multi_step_domain_completes_with_counted_outcomes(temper_home, tiny_model):
    from workloads.evaluate import LocalGenerator, _evaluate

    generate("ledger_tasks")
    domain = load_catalog(REPO / "domains")["ledger_tasks"]
    domain = domain.model_copy(update={"verifier": domain.verifier.model_copy(  # short turns: a quicker test
        update={"params": {**domain.verifier.params, "turn_tokens": 24}})})
    model = tiny_model(max_positions=2048)  # the ledger prompts (~550 tokens) fit: the model really plays
    result = _evaluate(LocalGenerator(model), model, domain, limit=4, max_new_tokens=8, keep_samples=0)
    assert result.too_long == 0
    assert result.n == result.scored == 4 and len(result.outcomes) == 4
    assert set(result.outcomes) <= set(ENDINGS) and all(t >= 1 for t in result.turns)
    assert all(t["turns"] and t["outcome"] == o for t, o in zip(result.trajectories, result.outcomes))
