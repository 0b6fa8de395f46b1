"""infra.jobspec.job_name: the one name of a stage's job (training and eval, local and Kubernetes)."""

from __future__ import annotations

import re
import uuid

import pytest

from infra.jobspec import NAME_MAX, JobSpec, job_name

DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# fixed ids (uuid5, not uuid4): every test process must collect the same test names (pytest-xdist)
RUN_IDS = [uuid.uuid5(uuid.NAMESPACE_DNS, f"run-{i}") for i in range(3)]
CASES = [("grpo", "pt-1a2b3c4d-grpo"), ("sft", "pt-local-sft"), ("eval-base", RUN_IDS[0].hex),
         ("eval-candidate", RUN_IDS[1].hex), ("grpo", "my_run"), ("GRPO", "Run.With Spaces"),
         ("sft", "x" * 200), ("eval-base", str(RUN_IDS[2])), ("grpo", "-"), ("grpo", "")]


@pytest.mark.parametrize("max_len", [NAME_MAX, 44])
@pytest.mark.parametrize("stage, run", CASES)
def test_a_name_is_deterministic_dns_1123_short_enough_and_starts_with_its_stage(stage, run, max_len):
    name = job_name(stage, run, max_len)
    assert name == job_name(stage, run, max_len)  # a retry computes the same name: it finds its own job
    assert DNS_1123.match(name) and len(name) <= max_len, name
    assert name.startswith(stage.lower() + "-"), name  # readable: which stage this job is
    JobSpec(name=name, kind="train", command=["true"])  # the spec's own check agrees


def test_a_readable_name_is_kept_as_is_else_a_hash_of_the_whole_keeps_names_apart():
    # the local claim file <home>/jobs/<name>.pid by which `temper resume` stops a job left running
    assert job_name("grpo", "pt-1a2b3c4d-grpo") == "grpo-pt-1a2b3c4d-grpo"
    run_id = "0123456789abcdef0123456789abcdef"  # an MLflow run id: the eval jobs' run
    assert job_name("eval-base", run_id, 44) == f"eval-base-{run_id}"
    long = job_name("eval-candidate", run_id, 44)
    assert len(long) == 44 and long.startswith("eval-candidate-0123")
    assert long != job_name("eval-candidate", run_id[:-1] + "0", 44)  # differ past the cut: differ
    assert job_name("grpo", "my_run") != job_name("grpo", "my-run")  # differ in a replaced character: differ
    assert job_name("grpo", "my_run").startswith("grpo-my-run-")
    with pytest.raises(ValueError, match="max_len 8"):
        job_name("grpo", "r", 8)
