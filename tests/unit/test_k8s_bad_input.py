"""Bad input on the Kubernetes path: each is one line naming the object and the reason, before or
while the first job starts, and what the attempt created is deleted. Decisions are taken on the
official client's model objects (ResourceQuota, Job, Pod statuses) and ``ApiException``s as the
client raises them; the API layer is the fake of ``ClusterApi`` in test_k8s_manifests.py."""

from __future__ import annotations

import json

import pytest
import urllib3
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.jobspec import JobSpec, Resources
from infra.k8s import manifests as m
from infra.k8s import preflight
from infra.k8s.errors import KubernetesError
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.outcomes import classify
from infra.k8s.options import KubernetesOptions
from tests.unit.test_k8s_manifests import FakeApi

OPTS = KubernetesOptions(poll_interval_s=1, unschedulable_after_s=60)


def _train(**kw) -> JobSpec:
    return JobSpec(**{**dict(name="sft-pt-1", kind="train", command=["python", "-m", "workloads.train", "sft"], nodes=2,
                             distributed=True, resources=Resources(cpu="1", memory="4Gi"), retries=1), **kw})


def _api_error(status: int, reason: str, message: str) -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return e


class Cluster:
    """Fake preflight reads; each answer is what the client returns or raises for that case."""

    def __init__(self, **broken):
        self.broken = broken

    def version(self):
        if "unreachable" in self.broken:
            raise urllib3.exceptions.MaxRetryError(None, "/version", reason=ConnectionRefusedError(111, "Connection refused"))
        return "1.33"

    def read_namespace(self, name):
        if "namespace" in self.broken:
            raise _api_error(404, "Not Found", f'namespaces "{name}" not found')
        raise _api_error(403, "Forbidden", "namespaces is forbidden: cluster scope")  # a namespaced Role: cannot tell

    def read_service_account(self, ns, name):
        if "service_account" in self.broken:
            raise _api_error(404, "Not Found", f'serviceaccounts "{name}" not found')
        return k.V1ServiceAccount(metadata=k.V1ObjectMeta(name=name, namespace=ns))

    def can_i(self, verb, resource, namespace, group="", subresource=None):
        if "no_ssar" in self.broken:
            raise _api_error(404, "Not Found", "the server could not find the requested resource")
        denied = self.broken.get("rbac")
        return (denied != (verb, resource)), "no RBAC policy matched" if denied == (verb, resource) else ""

    def list_resource_quotas(self, namespace):
        hard = self.broken.get("quota")
        if not hard:
            return []
        return [k.V1ResourceQuota.model_validate({"metadata": {"name": "temper", "namespace": namespace},
                                                  "spec": {"hard": hard}, "status": {"hard": hard, "used": {}}})]


def _check(cluster: Cluster, spec: JobSpec | None = None) -> None:
    objects = m.objects_for(spec or _train(), OPTS)
    preflight.check(cluster, "https://10.0.0.1:6443", OPTS.namespace, OPTS.service_account, objects)


@pytest.mark.parametrize("broken, words", [
    ({"unreachable": True}, ["Kubernetes API server https://10.0.0.1:6443: not reachable", "Connection refused"]),
    ({"namespace": True}, ["namespace 'temper': not found"]),
    ({"service_account": True}, ["service account temper/temper-workload: not found"]),
    ({"rbac": ("create", "jobs")}, ["RBAC denied: may not create jobs in namespace 'temper'", "no RBAC policy matched"]),
    ({"rbac": ("get", "pods")}, ["RBAC denied: may not get pods/log"]),
    ({"quota": {"requests.cpu": "1"}}, ["ResourceQuota temper/temper: allows requests.cpu=1", "needs 2 at once",
                                        "can never be admitted"]),
    ({"quota": {"pods": "1"}}, ["allows pods=1", "needs 2"]),
])
def test_preflight_names_the_object_and_the_reason_in_one_line(broken, words):
    with pytest.raises(KubernetesError) as e:
        _check(Cluster(**broken))
    line = str(e.value)
    assert "\n" not in line and all(w in line for w in words), line


def test_preflight_passes_a_job_the_cluster_can_admit_and_skips_what_it_cannot_read():
    _check(Cluster(quota={"requests.cpu": "8", "requests.memory": "20Gi", "pods": "20"}))
    _check(Cluster(no_ssar=True))  # no SelfSubjectAccessReview: the creates report RBAC themselves


def test_demand_counts_every_pod_of_a_gang_and_every_shard():
    train = preflight.demand_of(m.objects_for(_train(), OPTS))
    assert train["requests.cpu"] == 2 and train["requests.memory"] == 2 * 4 * 2**30 and train["pods"] == 2
    assert train["services"] == 1 and train["count/jobs.batch"] == 1
    ev = preflight.demand_of(m.objects_for(JobSpec(name="eval-x", kind="eval", command=["python"]), OPTS, shards=3))
    assert ev["pods"] == 3 and ev["count/jobs.batch"] == 3 and "services" not in ev


class RefusingApi(FakeApi):
    """Creates succeed until ``refuse`` names the object, which gets ``error``."""

    def __init__(self, refuse: str, error: ApiException, **kw):
        super().__init__({}, **kw)
        self.refuse, self.error = refuse, error

    def create(self, obj):
        if obj.metadata.name == self.refuse and obj.kind == "Job":
            raise self.error
        return super().create(obj)


@pytest.mark.parametrize("error, words", [
    (_api_error(403, "Forbidden", 'jobs.batch is forbidden: User "system:serviceaccount:temper:x" cannot create '
                "resource \"jobs\""), ["Job temper/sft-pt-1: RBAC denied create", "cannot create resource"]),
    (_api_error(403, "Forbidden", 'jobs.batch "sft-pt-1" is forbidden: exceeded quota: temper, requested: '
                "count/jobs.batch=1, used: count/jobs.batch=20, limited: count/jobs.batch=20"),
     ["refused by a ResourceQuota", "exceeded quota"]),
    (_api_error(404, "Not Found", 'namespaces "temper" not found'), ["namespace 'temper': not found"]),
])
def test_a_refused_create_deletes_what_the_attempt_created_and_says_why(error, words):
    api = RefusingApi("sft-pt-1", error)
    with pytest.raises(KubernetesError) as e:
        KubernetesLauncher(api, OPTS, sleep=lambda s: None).run(_train(), lambda s: None)
    line = str(e.value)
    assert "\n" not in line and all(w in line for w in words), line
    assert api.created == ["sft-pt-1"] and api.deleted == [("Service", "sft-pt-1")]  # the headless Service, created first


def _waiting(reason: str, message: str) -> k.V1Pod:
    return k.V1Pod.model_validate({"metadata": {"name": "sft-pt-1-0-abcde", "namespace": "temper"}, "status": {
        "phase": "Pending", "containerStatuses": [{"name": "main", "image": "registry.example.com/nope:1", "imageID": "",
                                                   "ready": False, "restartCount": 0,
                                                   "state": {"waiting": {"reason": reason, "message": message}}}]}})


JOB = k.V1Job(metadata=k.V1ObjectMeta(name="sft-pt-1"), spec=k.V1JobSpec(template=k.V1PodTemplateSpec()),
              status=k.V1JobStatus(active=2))


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff"])
def test_an_image_that_cannot_be_pulled_fails_at_once_naming_the_pod(reason):
    out = classify(JOB, [_waiting(reason, 'failed to pull image "registry.example.com/nope:1": not found')], 0, OPTS)
    err = out.error("sft-pt-1")
    assert out.state == "failed" and not out.retriable and err.pod == "sft-pt-1-0-abcde"
    assert "ImagePullBackOff" in str(err) and "registry.example.com/nope:1" in str(err) and "\n" not in str(err)


def test_unschedulable_pods_fail_after_the_grace_period_with_the_schedulers_words():
    pod = k.V1Pod.model_validate({"metadata": {"name": "sft-pt-1-0-abcde"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu."}]}})
    assert classify(JOB, [pod], 59, OPTS).state == "running"
    out = classify(JOB, [pod], 60, OPTS)
    assert out.state == "failed" and out.reason == "Unschedulable" and "Insufficient cpu" in out.message


class History(FakeApi):
    """A previous task attempt left Job sft-pt-1 Failed (kept for its logs); -r1 then succeeds."""

    def read_job(self, ns, name):
        status = {"conditions": [{"type": "Failed" if name == "sft-pt-1" else "Complete", "status": "True"}]}
        return k.V1Job(metadata=k.V1ObjectMeta(name=name, labels={m.JOB_LABEL: name}),
                       status=k.V1JobStatus.model_validate(status))


def test_a_retried_task_skips_its_failed_job_and_starts_the_next_attempt():
    api = History({}, existing={"sft-pt-1"})
    logs: list[str] = []
    assert KubernetesLauncher(api, OPTS, sleep=lambda s: None).run(_train(), logs.append) == "sft-pt-1-r1"
    assert "sft-pt-1-r1" in api.created and any("failed in an earlier attempt" in line for line in logs)
    assert ("Job", "sft-pt-1") not in api.deleted  # kept until its TTL, for its logs
