"""A long-context domain through the eval job's code and MLflow: per-item prompt lengths travel with the
rewards, the effective context length is recorded (table, plot, metric), and the gate reads it back.

The tiny model (512 positions) reads only the shortest prompts and answers none: "not measurable".
Oracles that answer correctly up to a length show a measured length and a candidate that lost context.
"""

import json

import mlflow

from infra.tracking.connection import configure
from infra.tracking.runs import open_run
from temper.core.settings import get_settings
from temper.core.tag_names import TAG_EFFECTIVE_CONTEXT, TAG_KIND
from temper.data.catalog import load_catalog
from temper.data.datasets import load_dataset
from temper.lifecycle.evaluation import record_eval, summary
from temper.registry.gate import PromotionPolicy, decide
from temper.registry.registration import run_curves, run_samples
from tests.integration.conftest import generate
from workloads.evaluate import _evaluate, evaluate_domains

DOMAIN = "long_retrieval"


def _oracle(answers: dict[str, str], up_to: int):
    """A 'model' that knows every answer but reads only prompts of up to ``up_to`` characters (= tokens here)."""
    def produce(prompts: list[str], max_new_tokens: int) -> list[str]:
        return [answers[p] if len(p) <= up_to else "no idea" for p in prompts]
    return produce


def test_tiny_model_eval_records_lengths_and_says_not_measurable(tracked, tiny_model):
    generate(DOMAIN)
    (result,) = evaluate_domains(str(tiny_model()), [DOMAIN], limit=25, max_new_tokens=8)
    assert sorted(set(result.context_lengths)) == [448, 1024, 2048, 4096, 8192]
    assert result.too_long == 20  # only the 448-token prompts fit 512 positions with 8 new tokens
    configure()
    parent = open_run("post_training", "pt-long", tags={TAG_KIND: "lifecycle"})
    run_id = record_eval(result.to_dict(), "candidate", parent)
    run = mlflow.MlflowClient().get_run(run_id)
    assert run.data.tags[TAG_EFFECTIVE_CONTEXT].startswith("not measurable (short-context accuracy 0.00")
    assert "effective_context_tokens" not in run.data.metrics and run.data.metrics["short_context_accuracy"] == 0.0
    table = json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/eval/{DOMAIN}-context.json"))
    assert table["lengths"] == [448, 1024, 2048, 4096, 8192] and table["n"] == [5] * 5 and not table["measurable"]
    assert "eval/long_retrieval-context.png" in {a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "eval")}
    assert run_curves([summary(result.to_dict() | {"run_id": run_id})])[DOMAIN] == list(
        zip(result.context_lengths, result.rewards))


def test_a_candidate_that_reads_less_of_the_context_is_held_back_by_the_gate(tracked):
    generate(DOMAIN)
    domain = load_catalog(get_settings().catalog_dir)[DOMAIN]
    frame = load_dataset(domain, get_settings()).frame
    answers = {domain.render_prompt(r): r["answer"] for r in frame.to_dict(orient="records")}
    configure()
    parent = open_run("post_training", "pt-long-gate", tags={TAG_KIND: "lifecycle"})
    results = {}
    for label, reads in (("champion", 10_000), ("candidate", 2_100)):
        result = _evaluate(_oracle(answers, reads), "oracle", domain, 100, 8, 0).to_dict()
        result["run_id"] = record_eval(result, label, parent)
        results[label] = summary(result)
    assert results["champion"]["effective_context"] == "8192 tokens (95% CI [8192, 8192])"
    assert results["candidate"]["effective_context"] == "2048 tokens (95% CI [2048, 2048])"
    curves = {k: run_curves([v]) for k, v in results.items()}
    means = {k: {DOMAIN: v["mean_reward"]} for k, v in results.items()}
    decision = decide(means["candidate"] | {"other": 1.0}, means["champion"] | {"other": 0.0}, PromotionPolicy(),
                      run_samples([results["candidate"]]), run_samples([results["champion"]]),
                      curves["candidate"], curves["champion"])
    assert not decision.passed and decision.lost_context == [DOMAIN], decision.reason
    same = decide(means["champion"], means["champion"], PromotionPolicy(), candidate_curves=curves["champion"],
                  champion_curves=curves["champion"])
    assert same.lost_context == [] and "tie keeps the champion" in same.reason
