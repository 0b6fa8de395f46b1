"""Generated manifests validate offline (schema 1.33, strict) and hold their policies; the launcher
state machine runs against a fake of the thin API layer (no API server can run here). Static
manifests (k8s/) are tested in test_k8s_static.py, failure mapping in test_k8s_failures.py."""

from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.jobspec import JobSpec, Resources
from infra.k8s import manifests as m
from infra.k8s.errors import JobFailed
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.options import KubernetesOptions
from infra.k8s.render import load_render_config, render
from tests.unit.test_k8s_static import restricted_violations

ROOT = Path(__file__).resolve().parents[2]
OPTS = KubernetesOptions(poll_interval_s=0.01, queue_name="q", runtime_class="gvisor")


def _train(**kw):
    base = dict(name="sft-abc", kind="train", command=["python", "-m", "workloads.train", "sft"], nodes=2,
                procs_per_node=2, distributed=True, resources=Resources(gpus=2), retries=1)
    return JobSpec(**{**base, **kw})


@pytest.mark.parametrize("cfg", sorted((ROOT / "configs/k8s").glob("*.yaml")), ids=lambda p: p.name)
def test_rendered_configs_validate(cfg):
    for doc in render(load_render_config(cfg)):
        kubernetes_validate.validate(doc, "1.33", strict=True)


def test_training_job_is_gang_indexed_with_rendezvous():
    svc, job = [m.to_dict(o) for o in m.objects_for(_train(), OPTS)]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"] == 2
    assert spec["backoffLimit"] == 0 and job["metadata"]["labels"][m.QUEUE_LABEL] == "q"
    pod = spec["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == "sft-abc-0.sft-abc" and pod["subdomain"] == svc["metadata"]["name"]
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    shm = [v for v in pod["volumes"] if v["name"] == "dshm"][0]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert svc["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("python", ["python", "python3", "/opt/venv/bin/python3.11"])
def test_rendezvous_line_drops_the_interpreter_even_as_a_full_path(python):
    """training_job() puts sys.executable first; accelerate must get the module, not the interpreter."""
    line = m.rendezvous_command(_train(command=[python, "-m", "workloads.train", "sft"]), OPTS)
    assert line[:2] == ["accelerate", "launch"] and line[-3:] == ["--module", "workloads.train", "sft"]
    assert python not in line


def test_sandbox_pod_is_restricted():
    pod = m.to_dict(m.sandbox_pod("sb-1", OPTS, 60))["spec"]
    sc = pod["containers"][0]["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False and pod["activeDeadlineSeconds"] == 60
    assert pod["runtimeClassName"] == "gvisor"
    assert restricted_violations(pod) == []
    mounts = {vm["mountPath"] for vm in pod["containers"][0]["volumeMounts"]}
    assert mounts == {m.SANDBOX_WORK, m.SANDBOX_TMP} and pod["containers"][0]["workingDir"] == m.SANDBOX_WORK


class FakeApi:
    """Fake of the thin ClusterApi layer only; statuses are the client's real models."""

    def __init__(self, job_status, pods=(), existing=()):
        self.job_status, self.pods, self.existing = job_status, list(pods), set(existing)
        self.created, self.deleted, self.jobs = [], [], {}

    def create(self, obj):
        if obj.metadata.name in self.existing:
            raise ApiException(status=409, reason="AlreadyExists")
        self.created.append(obj.metadata.name)
        self.jobs[obj.metadata.name] = obj
        return obj

    def read_job(self, ns, name):
        job = self.jobs.get(name) or k.V1Job(metadata=k.V1ObjectMeta(name=name, labels={m.JOB_LABEL: name}))
        return job.model_copy(update={"status": k.V1JobStatus.model_validate(self.job_status)})

    def list_pods(self, ns, selector):
        return [k.V1Pod.model_validate(p) for p in self.pods]

    def delete(self, kind, ns, name):
        self.deleted.append((kind, name))

    def stream_log(self, ns, pod, container):
        return iter(["step 1 loss 2.0"])

    def list_failed_creates(self, ns, job):
        return []

    def list_resource_quotas(self, ns):
        return []


FAILED = {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}
OOM_POD = {"metadata": {"name": "sft-abc-0-x"}, "status": {"phase": "Failed", "containerStatuses": [
    {"name": "main", "image": "i", "imageID": "", "ready": False, "restartCount": 0,
     "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}


def test_success_adopts_existing_and_streams_logs():
    api = FakeApi({"conditions": [{"type": "Complete", "status": "True"}]},
                  pods=[{"metadata": {"name": "p0"}, "status": {"phase": "Succeeded"}}], existing={"sft-abc"})
    logs = []
    assert KubernetesLauncher(api, OPTS, sleep=lambda s: None).run(_train(), logs.append) == "sft-abc"
    assert "sft-abc" not in api.created and any("adopted existing Job" in line for line in logs)
    assert "[p0] step 1 loss 2.0" in logs and ("Service", "sft-abc") in api.deleted


def test_oom_is_not_retried_and_names_the_pod():
    api = FakeApi(FAILED, pods=[OOM_POD])
    with pytest.raises(JobFailed) as e:
        KubernetesLauncher(api, OPTS, sleep=lambda s: None).run(_train(), lambda s: None)
    assert e.value.reason == "OOMKilled" and e.value.pod == "sft-abc-0-x" and "sft-abc-r1" not in api.created


def test_image_pull_fails_fast_and_cleans_up():
    pod = {"metadata": {"name": "p0"}, "status": {"phase": "Pending", "containerStatuses": [
        {"name": "main", "image": "i", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}}
    api = FakeApi({"active": 1}, pods=[pod])
    with pytest.raises(JobFailed) as e:
        KubernetesLauncher(api, OPTS, sleep=lambda s: None).run(_train(), lambda s: None)
    assert e.value.reason == "ImagePullBackOff" and ("Job", "sft-abc") in api.deleted


def test_crashed_rank_retries_as_new_attempt():
    pod = {"metadata": {"name": "p0"}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "main", "image": "i", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}}
    api = FakeApi(FAILED, pods=[pod])
    with pytest.raises(JobFailed) as e:
        KubernetesLauncher(api, OPTS, sleep=lambda s: None).run(_train(), lambda s: None)
    assert e.value.reason == "Error" and "sft-abc-r1" in api.created


def test_render_command_refuses_a_file_as_output_and_replaces_stale_manifests(tmp_path, capsys):
    """`temper k8s render` as a user runs it: --out on a file is one line and exit 1; rendering into a
    folder used before leaves only the new manifests (and files that are not manifests)."""
    from temper.cli import main

    repo = Path(__file__).resolve().parents[2]
    target = tmp_path / "passwd"
    target.write_text("root:x:0:0\n")
    assert main(["k8s", "render", "--config", str(repo / "configs/k8s/sandbox-batch.yaml"), "--out", str(target)]) == 1
    assert "exists and is not a directory" in capsys.readouterr().err and target.read_text() == "root:x:0:0\n"
    out = tmp_path / "manifests"
    assert main(["k8s", "render", "--config", str(repo / "configs/k8s/eval-shards.yaml"), "--out", str(out)]) == 0
    assert len(list(out.glob("*.yaml"))) == 4
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["k8s", "render", "--config", str(repo / "configs/k8s/sandbox-batch.yaml"), "--out", str(out)]) == 0
    new = capsys.readouterr().out.split()
    assert sorted(p.name for p in out.iterdir()) == sorted([Path(p).name for p in new] + ["notes.txt"])
