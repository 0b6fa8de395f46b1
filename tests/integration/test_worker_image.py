"""The Prefect worker's image (docker/Dockerfile.worker, `scripts/build-image.sh --worker`) is the worker: run
as k8s/base/prefect-worker.yaml runs it (uid 1000, read-only root filesystem, HOME on a scratch mount, nothing
installed at start, no pip in its command), it picks up a run of a deployment on the `kubernetes` work pool from
the Prefect server and creates the flow-run Job on the stand-in cluster, whose pod runs the flow.

The image is this tree's (tagged by the hash of its inputs), so a stale one never stands in. Skipped when podman
or that image is missing (cold build ~4 min here): `scripts/build-image.sh --worker` first. The host network
stands in for the pod network: the worker reaches the stand-in API server and the Prefect server on loopback.
"""

import os
import shutil
import subprocess

import pytest
from kubernetes import client as k

from tests.conftest import REPO
from tests.integration.test_flow_post_training_k8s import NS, POOL, _prefect, check_flow_run_job, k8s_worker, on_cluster  # noqa: F401

pytestmark = pytest.mark.slow
FLOW_DOMAINS = ("arithmetic",)


def unavailable(why: str):
    """Skip, or fail under `make test-containers` (TEMPER_REQUIRE_CONTAINERS=1), which must not pass having run nothing."""
    if os.environ.get("TEMPER_REQUIRE_CONTAINERS") == "1":
        pytest.fail(f"containers required (TEMPER_REQUIRE_CONTAINERS=1) but {why}", pytrace=False)
    pytest.skip(why)


def WORKER_IMAGE() -> str:
    """This tree's worker image (the k8s_worker fixture runs the worker in it), or skip."""
    env = {**os.environ, "CONTAINERS_CONF": str(REPO / "docker" / "containers.conf")}
    if shutil.which("podman") is None:
        unavailable("no podman: the worker image needs it")
    tag = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "--worker", "--tag"], capture_output=True,
                         text=True, env=env).stdout.strip()
    if not tag or subprocess.run(["podman", "--runtime", "runc", "image", "exists", tag], env=env).returncode != 0:
        unavailable(f"this tree's worker image {tag or '(no base image)'} is not built: scripts/build-image.sh --worker")
    return tag


@pytest.mark.timeout(600)
def test_the_worker_image_turns_a_deployment_run_into_a_flow_run_job_that_runs_the_flow(on_cluster, k8s_worker):
    from prefect.deployments import run_deployment

    _, log = k8s_worker

    async def deployment(client):
        # validate_data: a light flow; the deployment's shape is prefect.yaml's kubernetes one (code at /app)
        flow_id = await client.create_flow_from_name("validate_data")
        return await client.create_deployment(
            flow_id=flow_id, name="validate-data-k8s", entrypoint="flows/validate_data.py:validate_data", work_pool_name=POOL,
            job_variables={"image": "temper-workload:latest", "env": {"TEMPER_STORAGE_ROOT": os.environ["TEMPER_STORAGE_ROOT"]}},
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": "/app"}}])

    _prefect(deployment)
    env = {"TEMPER_TRACKING_URI": os.environ["TEMPER_TRACKING_URI"], "TEMPER_S3_ENDPOINT_URL": os.environ["TEMPER_S3_ENDPOINT_URL"]}
    run = run_deployment("validate_data/validate-data-k8s", parameters={"params": {"domains": ["arithmetic"]}},
                         job_variables={"env": env}, timeout=400, poll_interval=2)
    assert run.state.is_completed(), (run.state.message, log.read_text()[-3000:])
    batch = k.BatchV1Api(on_cluster.api_client)
    (job,) = batch.list_namespaced_job(NS, label_selector=f"prefect.io/flow-run-id={run.id}").items
    on_cluster.wait_for("the flow-run Job succeeded", lambda: batch.read_namespaced_job(job.metadata.name, NS).status.succeeded,
                        timeout=60)
    check_flow_run_job(on_cluster, run, batch.read_namespaced_job(job.metadata.name, NS))
    assert "Worker 'standin-worker' started!" in log.read_text()
