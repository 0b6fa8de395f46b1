"""A training Job, as the flow builds it, submitted by infra/k8s/launcher.py to the stand-in cluster.

The whole 2-pod ZeRO-3 run (two pods that rendezvous over the headless Service's names and shard
the model, losses equal to the local run's) and the eviction of one rank with the retry Job
resuming from the checkpoint in the store run through the flow, in
test_flow_post_training_k8s.py::test_post_training_on_the_cluster_equals_the_local_run. They were
launcher-level tests here too (~4.5 min of the suite for what the flow test already proves), so
what is left is the training Job that can never be scheduled: no pod ever starts, so it is fast.
"""

from __future__ import annotations

import pytest
import yaml

from infra.jobspec import Resources
from infra.k8s.api import ClusterApi
from infra.k8s.errors import JobFailed
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.options import KubernetesOptions
from temper.training.config import nest_stage_fields

NS = "temper"


def test_a_job_that_never_fits_fails_with_the_reason_and_leaves_nothing(k8s_cluster, tmp_path):
    from temper.training.job import training_job

    cfg = {"run_name": "too-big", "domains": ["arithmetic"], "output_dir": "/tmp/temper-run", "tracking": False,
           "mode": "sft", "base_model": str(tmp_path / "never-read"), "max_steps": 12, "learning_rate": 1e-3,
           "per_device_batch_size": 4}
    config = tmp_path / "too-big.yaml"
    config.write_text(yaml.safe_dump(nest_stage_fields(cfg)))
    spec = training_job(str(config), "sft").model_copy(update={  # 2 pods x 1 rank, as the flow submits it
        "nodes": 2, "procs_per_node": 1, "accelerate_config": "/app/docker/accelerate-zero3-multinode-cpu.yaml",
        "resources": Resources(cpu="64", memory="1Ti")})
    k8s_cluster.create_namespace(NS)
    opts = KubernetesOptions(namespace=NS, priority_class=None, s3_secret=None, poll_interval_s=0.5,
                             unschedulable_after_s=2.0)
    with pytest.raises(JobFailed) as e:
        KubernetesLauncher(ClusterApi(k8s_cluster.api_client), opts).run(spec, on_log=lambda _: None)
    message = str(e.value)
    assert "\n" not in message and "sft-too-big" in message and "Unschedulable" in message
    assert "Insufficient cpu" in message and "Insufficient memory" in message, message
    k8s_cluster.wait_for("namespace empty", lambda: k8s_cluster.leftovers(NS) == {}, timeout=15)
