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
