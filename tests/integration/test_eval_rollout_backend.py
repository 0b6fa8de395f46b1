"""The eval job through the rollout backend (embedded engine behind the OpenAI API) scores like local generate."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("profile", ["standard", "fast"])
def test_eval_job_gives_the_same_result_through_the_rollout_engine(temper_home, tmp_path, monkeypatch, profile):
    """Either serving profile (the fast one: prompt lookup behind the same OpenAI API) scores as local generate."""
    from temper.cli import main
    from temper.core.settings import get_settings
    from temper.training.tiny import init_tiny
    from workloads.evaluate import evaluate_domain

    monkeypatch.setenv("TEMPER_ROLLOUT_PROFILE", profile)
    get_settings.cache_clear()
    assert get_settings().rollout.profile == profile
    assert main(["data", "generate", "--domain", "invoice_extraction"]) == 0
    model = str(init_tiny(tmp_path / "tiny"))
    local = evaluate_domain(model, "invoice_extraction", limit=8, max_new_tokens=24)
    served = evaluate_domain(model, "invoice_extraction", limit=8, max_new_tokens=24, generator="rollout")
    assert served.ids == local.ids and served.n == 8
    assert [s["completion"] for s in served.samples] == [s["completion"] for s in local.samples]
    assert served.rewards == local.rewards


def test_a_long_context_domain_scores_the_same_through_the_served_engine(temper_home, tmp_path):
    """Prompts longer than the served context are refused by the server (413) and scored as "", exactly as
    the local path skips them; the ones that fit are generated and scored the same."""
    from temper.cli import main
    from temper.training.tiny import init_tiny
    from workloads.evaluate import evaluate_domain

    assert main(["data", "generate", "--domain", "long_tool_history"]) == 0
    model = str(init_tiny(tmp_path / "tiny"))
    local = evaluate_domain(model, "long_tool_history", limit=10, max_new_tokens=6)
    served = evaluate_domain(model, "long_tool_history", limit=10, max_new_tokens=6, generator="rollout")
    assert served.too_long == local.too_long == 8 and served.context_lengths == local.context_lengths
    assert [s["completion"] for s in served.samples] == [s["completion"] for s in local.samples]
    assert served.rewards == local.rewards


def test_eval_records_sharing_a_document_reuse_its_kv_and_the_hit_rate_is_logged(tracked, tmp_path):
    """Two eval records that read the same long document, through the served engine: the second one's
    document comes from the prefix cache (usage.cached_tokens), and the eval run records the hit rate."""
    import mlflow
    from transformers import AutoTokenizer

    from infra.tracking.connection import configure
    from infra.tracking.runs import open_run
    from temper.core.tag_names import TAG_KIND
    from temper.lifecycle.evaluation import record_eval
    from temper.training.tiny import init_tiny
    from workloads.evaluate import EvalResult, RolloutGenerator

    model = str(init_tiny(tmp_path / "tiny"))
    doc = "document: " + " ".join(f"vault {i} holds code {1000 + 37 * i}." for i in range(12)) + "\n"
    prompts = [doc + "question: which code does vault 3 hold?\nanswer:",
               doc + "question: which code does vault 17 hold?\nanswer:"]
    tok = AutoTokenizer.from_pretrained(model)
    ids = [tok(p)["input_ids"] for p in prompts]
    shared = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    assert shared > 200  # a long shared document, then the two questions
    gen = RolloutGenerator(model)
    try:
        gen(prompts, 4)
    finally:
        gen.close()
    assert gen.prompt_tokens == len(ids[0]) + len(ids[1])
    assert gen.cached_prompt_tokens == shared  # the later record read the whole document from the cache

    result = EvalResult(domain="shared_doc", model=model, dataset_uri="memory://", dataset_sha256="0" * 64, n=2,
                        scored=2, mean_reward=0.0, pass_rate=0.0, rewards=[0.0, 0.0], ids=["a", "b"],
                        prompt_tokens=gen.prompt_tokens, cached_prompt_tokens=gen.cached_prompt_tokens)
    configure()
    parent = open_run("post_training", "pt-reuse", tags={TAG_KIND: "lifecycle"})
    metrics = mlflow.MlflowClient().get_run(record_eval(result.to_dict(), "candidate", parent)).data.metrics
    assert metrics["prompt_hit_rate"] == shared / gen.prompt_tokens > 0.4
    assert metrics["cached_prompt_tokens"] == shared
