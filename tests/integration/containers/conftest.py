"""Pods as real containers: the stand-in cluster whose node runs podman (runc) containers of the workload image.

Run by `make test-containers` (not by `make test`): it installs podman, builds this tree's image
(`scripts/build-image.sh`, cached by the hash of its inputs) and sets ``TEMPER_REQUIRE_CONTAINERS=1``, under
which a missing podman or image FAILS these tests instead of skipping them: a target that ran nothing must
not pass. Run by hand without it, they skip with the reason.

The servers the pods use (moto's S3, MLflow) and the stand-in's API server listen on the node's address, the
``podman`` bridge's gateway (10.88.0.1), which this machine and every container reach.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tests.integration.conftest import running_mlflow, running_moto

pytestmark = pytest.mark.slow


def unavailable(why: str):
    if os.environ.get("TEMPER_REQUIRE_CONTAINERS") == "1":
        pytest.fail(f"containers required (TEMPER_REQUIRE_CONTAINERS=1) but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def workload_image() -> str:
    """This tree's workload image (its tag is the hash of its inputs): a stale image never stands in for the code."""
    if shutil.which("podman") is None:
        unavailable("no podman: `make test-containers` installs it")
    from tests.k8s_standin.podman import podman_env

    tag = subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "--tag"], capture_output=True, text=True)
    ref = tag.stdout.strip()
    exists = subprocess.run(["podman", "--runtime", "runc", "image", "exists", ref], env=podman_env())
    if tag.returncode != 0 or not ref or exists.returncode != 0:
        unavailable(f"this tree's image {ref or '(no base image)'} is not built: run `make image`")
    return ref


@pytest.fixture(scope="session")
def node_address(workload_image):
    """The bridge's gateway, kept up for the session by a pod of its own (netavark drops the bridge with its last container)."""
    from tests.k8s_standin.podman import PodmanRuntime

    keeper = PodmanRuntime()
    try:
        yield keeper.start()
    finally:
        keeper.cleanup()


@pytest.fixture(scope="session")
def mlflow_server(node_address, tmp_path_factory):
    """The session's MLflow server, on the node's address (pods reach it there)."""
    with running_mlflow(tmp_path_factory.mktemp("mlflow"), node_address) as uri:
        yield uri


@pytest.fixture(scope="session")
def s3_server(node_address, tmp_path_factory):
    """moto's S3 server, on the node's address."""
    with running_moto(tmp_path_factory.mktemp("moto"), node_address) as url:
        yield url


@pytest.fixture
def k8s_cluster(tmp_path, workload_image, node_address):
    """The stand-in cluster (tests/k8s_standin) with its node running pods as podman containers of the images
    they name (``workload_image``: this tree's), each pod with its own address; otherwise as the bwrap one."""
    from tests.k8s_standin.cluster import StandinCluster

    cluster = StandinCluster(tmp_path / "k8s-standin", {}, containers=True)
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.errors, "stand-in controllers raised:\n" + "\n".join(cluster.errors)
