"""The workload image (`make image`: docker/Dockerfile built with podman on a Debian-packages base) runs the
eval workload as the manifests do: uid 1000, read-only root filesystem, only /tmp writable, no network;
its per-sample rewards equal the same eval run on the host.

The image is this tree's own (its tag is the hash of its inputs, `scripts/build-image.sh --tag`), so a
stale image never stands in for the code under test. `make test-containers` builds it (cold ~12 minutes,
warm 0.2 s) and fails this test if it is missing; run by hand, it skips without it (see conftest.py).
"""

import json
import subprocess

import pytest

from tests.k8s_standin.podman import podman_env

pytestmark = pytest.mark.slow


def _podman(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "--runtime", "runc", *args], capture_output=True, text=True, env=podman_env(), **kw)


@pytest.fixture
def image(workload_image):
    return workload_image


def test_the_image_runs_the_eval_workload_read_only_as_uid_1000_and_scores_as_the_host(image, temper_home, tmp_path):
    from temper.cli import main
    from temper.training.tiny import init_tiny
    from workloads.evaluate import evaluate_domain

    assert main(["data", "generate", "--domain", "arithmetic"]) == 0
    model = init_tiny(tmp_path / "tiny")
    host = evaluate_domain(str(model), "arithmetic", limit=8, max_new_tokens=6)
    # the pod runs as uid 1000; safetensors and atomic writes leave files 0600 to their (root) writer
    subprocess.run(["chmod", "-R", "a+rX", str(model), str(temper_home)], check=True)
    run = _podman("run", "--rm", "--read-only", "--tmpfs", "/tmp:rw,size=256m", "--network", "none",
                  "-v", f"{temper_home}:/data/home:ro", "-v", f"{model}:/data/tiny:ro",
                  "-e", "TEMPER_HOME=/data/home", "-e", "TEMPER_CATALOG_DIR=/app/domains", image, "sh", "-c",
                  "id -u && touch /app/x 2>/dev/null; echo root-writable=$? && python -m workloads.evaluate "
                  "--model /data/tiny --domain arithmetic --limit 8 --max-new-tokens 6 --out /tmp/out "
                  ">/dev/null && cat /tmp/out/arithmetic.json", timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    uid, writable, result = run.stdout.splitlines()[:3]
    assert uid == "1000" and writable == "root-writable=1"  # the root filesystem refused the write
    inside = json.loads(result)
    assert inside["ids"] == host.ids and inside["rewards"] == host.rewards
    assert [s["completion"] for s in inside["samples"]] == [s["completion"] for s in host.samples]
