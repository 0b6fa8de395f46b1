"""The eval job through the rollout backend (embedded engine behind the OpenAI API) scores like local generate."""

from __future__ import annotations


def test_eval_job_gives_the_same_result_through_the_rollout_engine(temper_home, tmp_path):
    from temper.cli import main
    from temper.training.tiny import init_tiny
    from workloads.evaluate import evaluate_domain

    assert main(["data", "generate", "--domain", "arithmetic"]) == 0
    model = str(init_tiny(tmp_path / "tiny"))
    local = evaluate_domain(model, "arithmetic", limit=12, max_new_tokens=6)
    served = evaluate_domain(model, "arithmetic", limit=12, max_new_tokens=6, generator="rollout")
    assert served.ids == local.ids and served.n == 12
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
