"""The post-training flow's SFT stage with its training pods as real containers of this tree's image.

Only the SFT stage (``prepare_base_model`` then ``train_stage("sft")``, the flow's own tasks, under Prefect's
test harness) runs here, not the whole ``post_training`` flow: with GRPO, sandbox pods and four eval Jobs in
containers, next to the local run it is compared with, it takes too long for the time `make test-containers`
has on CI. The whole flow on the bwrap node is test_flow_post_training_k8s.py.

Each rank is a podman container (uid 1000, read-only root, 1 CPU / 4 GiB as the manifest's limits, its own
network namespace and address): ``accelerate launch ... --module workloads.train`` rendezvous over gloo at
``<job>-0.<job>``, which the stand-in's DNS maps to rank 0's pod address, so the ZeRO-3 ranks talk across the
bridge. Config, base model, checkpoints and the exported model go through moto's S3 and the metrics to MLflow,
both listening on the node's address. Rank 1 is evicted after the first checkpoint is in S3: the Job fails
(rank 0 loses its peer), the launcher's retry Job resumes from that checkpoint. Asserted as in the bwrap
flow test: the failed attempt and its retry, the retry's "resuming from ... checkpoint-N", ZeRO-3 shards
in every pod, and every SFT loss logged to MLflow equal to a local run's of the same stage within 1e-5.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import threading
import time
import uuid

import pytest
from kubernetes import client as k

from tests.integration.test_flow_post_training_k8s import (  # noqa: F401 - on_cluster is a fixture
    INDEX,
    NS,
    EvictAfterFirstCheckpoint,
    _params,
    on_cluster,
    stage_losses,
)

pytestmark = pytest.mark.slow
FLOW_DOMAINS = ("arithmetic", "multiplication")


@pytest.fixture
def in_containers(on_cluster, workload_image):  # noqa: F811 - the imported fixture
    """The cluster of test_flow_post_training_k8s.py, its pods running this tree's image."""
    # what the pods read there (the kube config) is read by their uid 1000
    subprocess.run(["chmod", "-R", "a+rwX", str(on_cluster.shared_dir)], check=True)
    # not the host's DeepSpeed op cache (the bwrap pods' TORCH_EXTENSIONS_DIR): its build names the host's paths, so
    # the first pods rebuilt it; a rank in the image copies the op the image compiled into its own /tmp
    on_cluster.set_options(image=workload_image, env={})
    return on_cluster


class PodAddresses(threading.Thread):
    """Every pod's address as the API reports it, while the stage runs (the TTL controller deletes them after)."""

    def __init__(self, cluster) -> None:
        super().__init__(daemon=True)
        self.core, self.done, self.seen = k.CoreV1Api(cluster.api_client), threading.Event(), {}

    def run(self) -> None:
        while not self.done.wait(0.5):
            for pod in self.core.list_namespaced_pod(NS).items:
                if pod.status.pod_ip:
                    self.seen[pod.metadata.name] = pod.status.pod_ip


def _sft(backend: str) -> tuple[str, float]:
    """The flow's SFT stage on ``backend``; (the lifecycle run its stage run is under, seconds)."""
    import mlflow
    from prefect import flow

    from tasks.training import prepare_base_model, train_stage
    from temper.core.settings import get_settings

    mlflow.set_tracking_uri(get_settings().resolved_tracking_uri)
    params = _params(backend).resolved()
    parent = mlflow.MlflowClient().create_run(mlflow.set_experiment(f"sft-containers-{backend}").experiment_id)
    run_key = f"sft-{backend}-{uuid.uuid4().hex[:6]}"

    @flow
    def sft_stage() -> str:
        return train_stage("sft", params, prepare_base_model(params.base_model), run_key, parent.info.run_id)

    t = time.perf_counter()
    state = sft_stage(return_state=True)
    assert state.is_completed(), state.message
    return parent.info.run_id, time.perf_counter() - t


@pytest.mark.timeout(1800)
def test_sft_ranks_as_containers_rendezvous_over_the_bridge_and_resume_after_an_eviction(in_containers, workload_image):
    evictor, addresses = EvictAfterFirstCheckpoint(in_containers, "sft"), PodAddresses(in_containers)
    evictor.start()
    addresses.start()
    try:
        remote_run, remote_s = _sft("kubernetes")
    finally:
        evictor.done.set()
        addresses.done.set()

    batch, core = k.BatchV1Api(in_containers.api_client), k.CoreV1Api(in_containers.api_client)
    jobs = {j.metadata.name: j for j in batch.list_namespaced_job(NS).items}
    assert evictor.evicted and evictor.evicted.startswith("sft-"), "no SFT rank was evicted"
    sft = next(n for n in jobs if not n.endswith("-r1"))
    assert sorted(jobs) == [sft, f"{sft}-r1"], sorted(jobs)
    assert jobs[sft].status.failed and not jobs[sft].status.succeeded and jobs[f"{sft}-r1"].status.succeeded
    retry0 = core.list_namespaced_pod(NS, label_selector=f"temper.dev/job={sft}-r1,{INDEX}=0").items[0]
    resumed = [line for line in core.read_namespaced_pod_log(retry0.metadata.name, NS, container="main").splitlines()
               if "resuming from" in line]
    assert resumed and "checkpoint-" in resumed[0], "the retry Job did not resume from the checkpoint"
    assert retry0.spec.containers[0].image == workload_image

    # the training pods (2 ranks x 2 attempts, and the evicted index's replacement the failing Job may have made
    # first), each its own address on the bridge, none the node's or loopback
    train_pods = {n: ip for n, ip in addresses.seen.items() if n.startswith("sft-")}
    assert len(train_pods) >= 4 and len(set(train_pods.values())) == len(train_pods), train_pods
    node = ipaddress.ip_address(in_containers.node_ip)
    assert all(ipaddress.ip_address(ip) in ipaddress.ip_network(f"{node}/16", strict=False)
               and ipaddress.ip_address(ip) != node for ip in train_pods.values()), train_pods

    # ZeRO-3 across containers: each training pod held a part of the parameters (its emptyDir outlives it)
    for job in (sft, f"{sft}-r1"):
        reports = {p.name: json.loads(p.read_text()) for p in (in_containers.root / "pods").glob(
            f"{NS}_{job}-[01]-*/volumes/*/temper/runs/*/*/shards-rank*.json")}
        assert {"shards-rank0.json", "shards-rank1.json"} <= set(reports), (job, reports)
        assert all(0 < r["local_numel"] < r["full_numel"] for r in reports.values()), (job, reports)

    local_run, local_s = _sft("local")
    remote, local = stage_losses(remote_run, "sft"), stage_losses(local_run, "sft")
    assert sorted(remote) == sorted(local) == list(range(1, 21)), (remote, local)
    worst = max(abs(remote[s] - local[s]) for s in local)
    assert worst <= 1e-5, (remote, local)
    print(f"\nevicted {evictor.evicted} after '{evictor.after.strip()}'; the retry: {resumed[0].strip()[-160:]}\n"
          f"pods {train_pods}\nSFT losses containers vs local: largest difference {worst:.2e}; stage "
          f"{remote_s:.0f}s in containers (with the eviction and the retry Job) vs {local_s:.0f}s locally")
