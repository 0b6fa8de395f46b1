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


def test_a_cpu_rank_in_the_image_loads_the_comm_op_the_image_compiled(image):
    """Was: every CPU rank pod compiled DeepSpeed's comm op into its own /tmp at start (1-3 min on 2 cores). A rank as
    a pod runs it (uid 1000, read-only root, only /tmp writable) copies the image's build and loads it; ninja's build
    log is the image's, unchanged: nothing was compiled."""
    script = (
        "import os, time\n"
        "from temper.training.device import configure_rank, rank_placement\n"
        "from temper.training.deepspeed import seed_torch_extensions, torch_extensions_dir\n"
        "configure_rank(rank_placement('auto'))\n"
        "print(seed_torch_extensions())\n"
        "op = os.path.join(torch_extensions_dir(), 'deepspeed_shm_comm')\n"
        "log = open(os.path.join(op, '.ninja_log')).read()\n"
        "t = time.perf_counter()\n"
        "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder\n"
        "ShareMemCommBuilder().load()\n"
        "print(open(os.path.join(op, '.ninja_log')).read() == log, op, f'{time.perf_counter() - t:.1f}')\n")
    run = _podman("run", "--rm", "--read-only", "--tmpfs", "/tmp:rw,size=256m", "--network", "none", image,
                  "python", "-c", script, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()  # DeepSpeed prints its load time between the two
    copied, (unchanged, op, seconds) = lines[0], lines[-1].split()
    assert copied == "['deepspeed_shm_comm']" and op == "/tmp/torch_extensions/deepspeed_shm_comm", run.stdout
    assert unchanged == "True", run.stdout + run.stderr[-2000:]
    print(f"the image's comm op loaded in {seconds} s in a fresh container, nothing compiled")
