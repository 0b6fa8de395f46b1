"""Kueue objects of the gpu-cluster overlay: valid against Kueue's own CRDs, consistent with the options
and the jobs written for that cluster, and the launcher's reading of a Workload's QuotaReserved condition.

Kueue's CRDs are not in this repository (files of a fetched repository are kept outside it): they are
read from ``$TEMPER_KUEUE_CRDS`` or ``../shared/kueue-crds`` next to the checkout
(tests/k8s_standin/crds.py); the schema tests skip, naming that path, without them.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from kubernetes import client as k
from kubernetes.utils import parse_quantity

from infra.k8s.outcomes import kueue_outcome
from infra.k8s.render import load_render_config, render
from tests.k8s_standin import admission, crds, kueue
from tests.k8s_standin.controllers import tolerates
from tests.k8s_standin.store import Store
from tests.unit.test_k8s_static import CONFIG_TARGETS, KUEUE_API, RENDERED, ROOT, _options, find

GPU = RENDERED["overlays/gpu-cluster"]
KUEUE_DOCS = [d for d in GPU if d["apiVersion"].startswith(KUEUE_API)]
CRDS = crds.load_crds()
needs_crds = pytest.mark.skipif(not CRDS, reason=f"Kueue's CRD files not found in {crds.crd_dir()} (set "
                                f"{crds.CRDS_ENV}; they come from github.com/kubernetes-sigs/kueue "
                                "config/components/crd/bases, see docs/kubernetes.md)")
GPU_CONFIGS = sorted(c for c, target in CONFIG_TARGETS.items() if target == "overlays/gpu-cluster")


def the(kind: str) -> dict:
    (doc,) = [d for d in KUEUE_DOCS if d["kind"] == kind]
    return doc


def test_the_overlay_declares_a_flavor_a_cluster_queue_and_the_local_queue():
    assert sorted(d["kind"] for d in KUEUE_DOCS) == ["ClusterQueue", "LocalQueue", "ResourceFlavor"]
    assert {d["apiVersion"] for d in KUEUE_DOCS} == {"kueue.x-k8s.io/v1beta2"}


@needs_crds
@pytest.mark.parametrize("kind", ["ResourceFlavor", "ClusterQueue", "LocalQueue"])
def test_overlay_objects_validate_against_kueues_crds(kind):
    assert crds.validate(the(kind), CRDS) == []
    assert kueue.negative_quotas(the(kind)) == []


def _quota_entry(cq: dict) -> dict:
    return cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]


@needs_crds
@pytest.mark.parametrize("break_it, expected", [
    (lambda cq: _quota_entry(cq).update(maxQuota=8), "Additional properties are not allowed ('maxQuota' was unexpected)"),
    (lambda cq: _quota_entry(cq).update(nominalQuota="lots"), "nominalQuota: 'lots' does not match"),
    (lambda cq: _quota_entry(cq).update(nominalQuota=[1]), "nominalQuota: [1] is not valid under any of the given schemas"),
    (lambda cq: _quota_entry(cq).pop("nominalQuota"), "'nominalQuota' is a required property"),
    (lambda cq: cq["spec"].update(queueingStrategy="FIFO"), "'FIFO' is not one of ['StrictFIFO', 'BestEffortFIFO']"),
    (lambda cq: cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop(),  # a CEL rule of the CRD
     "flavors must have the same number of resources as the coveredResources"),
    (lambda cq: cq["metadata"].update(namespace="temper"), "ClusterQueue is cluster-scoped"),
    (lambda cq: cq.update(apiVersion="kueue.x-k8s.io/v1alpha1"), "no CRD serves ClusterQueue in kueue.x-k8s.io/v1alpha1"),
])
def test_a_wrong_cluster_queue_is_refused_by_the_schema(break_it, expected):
    cq = copy.deepcopy(the("ClusterQueue"))
    break_it(cq)
    errors = crds.validate(cq, CRDS)
    assert any(expected in e for e in errors), errors


def test_a_negative_quota_passes_the_schema_but_not_kueues_webhook():
    """The CRD's quantity pattern allows a sign; Kueue's validating webhook refuses a negative quota."""
    cq = copy.deepcopy(the("ClusterQueue"))
    _quota_entry(cq)["nominalQuota"] = "-4"
    if CRDS:
        assert crds.validate(cq, CRDS) == []
    assert kueue.negative_quotas(cq) == ['spec.resourceGroups[0].flavors[0].resources[0].nominalQuota: Invalid value: '
                                         '"-4": must be greater than or equal to 0']


def test_queue_names_selectors_and_flavor_agree_with_the_options(tmp_path):
    opts = _options(GPU, tmp_path)
    lq, cq, flavor = the("LocalQueue"), the("ClusterQueue"), the("ResourceFlavor")
    assert (lq["metadata"]["namespace"], lq["metadata"]["name"]) == (opts.namespace, opts.queue_name)
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"]
    ns_labels = find(GPU, "Namespace", opts.namespace)["metadata"]["labels"]
    assert cq["spec"]["namespaceSelector"]["matchLabels"].items() <= ns_labels.items()
    (group,) = cq["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    assert [f["name"] for f in group["flavors"]] == [flavor["metadata"]["name"]]
    assert flavor["spec"]["nodeLabels"].items() <= opts.node_selector.items()
    tolerations = [t.model_dump() for t in opts.tolerations]
    assert all(tolerates(tolerations, taint) for taint in flavor["spec"]["nodeTaints"])
    hard = find(GPU, "ResourceQuota", "temper")["spec"]["hard"]  # Kueue never promises more than the namespace may use
    for res in group["flavors"][0]["resources"]:
        assert parse_quantity(res["nominalQuota"]) <= parse_quantity(hard[f"requests.{res['name']}"]), res["name"]


def _admitted(store: Store) -> dict[str, dict]:
    return {w["metadata"]["ownerReferences"][0]["name"]: w for w in store.list("Workload")}


def test_the_cluster_queue_admits_the_gpu_jobs_it_is_sized_for_and_their_workloads_are_valid():
    """The rendered jobs of configs/k8s for this cluster, through the stand-in's Kueue (no HTTP): one
    Workload each (schema-checked on create when the CRDs are present), all admitted at once."""
    store = Store()
    store.create("Namespace", "", find(GPU, "Namespace", "temper"))
    for pc in (d for d in GPU if d["kind"] == "PriorityClass"):
        store.create("PriorityClass", "", pc)
    for doc in KUEUE_DOCS:
        store.create(doc["kind"], doc["metadata"].get("namespace", ""), doc, admit=lambda o: kueue.admit(store, o))
    jobs = [obj for config in GPU_CONFIGS for obj in render(load_render_config(ROOT / "configs/k8s" / config))
            if obj["kind"] == "Job"]
    assert len(jobs) == 5  # SFT (2 ranks) and 4 eval shards
    for job in jobs:
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == the("LocalQueue")["metadata"]["name"]
        assert job["spec"]["suspend"] is True
        store.create("Job", "temper", job, admit=admission.admit_job)
    controller = kueue.KueueController(store)
    controller.sync()
    workloads = _admitted(store)
    assert set(workloads) == {j["metadata"]["name"] for j in jobs}
    for name, wl in workloads.items():
        assert kueue._true(wl, "Admitted"), (name, wl["status"])
        assert store.get("Job", "temper", name)["spec"]["suspend"] is False
        if CRDS:
            assert crds.validate(wl, CRDS) == [], name
    sft = next(w for n, w in workloads.items() if n.startswith("sft"))
    assert sft["spec"]["podSets"][0]["count"] == 2 and sft["spec"]["priorityClassRef"]["name"] == "temper-training"
    assert sft["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {
        "cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}
    cq, lq = store.get("ClusterQueue", "", "temper"), store.get("LocalQueue", "temper", "temper-gpu")
    if CRDS:  # the status the stand-in writes is what Kueue's CRD allows
        assert crds.validate(cq, CRDS) == [] and crds.validate(lq, CRDS) == []
    assert (cq["status"]["admittedWorkloads"], lq["status"]["admittedWorkloads"]) == (5, 5)
    usage = {r["name"]: r["total"] for r in cq["status"]["flavorsUsage"][0]["resources"]}
    assert usage == {"cpu": "96", "memory": "640Gi", "nvidia.com/gpu": "12"}  # 64 + 4 x 8 CPU, 512Gi + 4 x 32Gi, 8 + 4


def _job(name: str = "sft-abc", queue: str = "temper-gpu") -> k.V1Job:
    return k.V1Job.model_validate({"metadata": {"name": name, "namespace": "temper", "uid": "u1",
                                                "labels": {"kueue.x-k8s.io/queue-name": queue}},
                                   "spec": {"suspend": True, "template": {"spec": {"containers": [{"name": "main"}]}}}})


def _workload(reason: str, message: str) -> dict:
    """A Workload as Kueue v0.19 leaves it when it cannot reserve quota (pkg/scheduler/scheduler.go)."""
    return yaml.safe_load(f"""
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata: {{name: job-sft-abc-1f2e3, namespace: temper, labels: {{kueue.x-k8s.io/job-uid: u1}}}}
spec: {{queueName: temper-gpu, podSets: [{{name: main, count: 2, template: {{spec: {{containers: []}}}}}}]}}
status:
  conditions:
    - {{type: QuotaReserved, status: "False", reason: {reason}, message: "{message}",
       lastTransitionTime: "2026-12-03T19:00:00Z"}}
""")


EXCEEDS = ("couldn't assign flavors to pod set main: insufficient quota for cpu in flavor temper-gpu-node, previously "
           "considered podsets requests (0) + current podset request (1024) > maximum capacity (512)")


def test_kueue_outcome_fails_a_job_that_can_never_be_admitted_and_waits_for_one_that_can():
    failed, why = kueue_outcome(_job(), [_workload("ExceedsMaxQuota", EXCEEDS)])
    assert failed.state == "failed" and failed.reason == "Inadmissible" and not failed.retriable and why == ""
    line = str(failed.error("sft-abc"))
    assert line.startswith("job 'sft-abc': Inadmissible: Kueue cannot admit it from LocalQueue temper/temper-gpu "
                           "(ExceedsMaxQuota: couldn't assign flavors")
    assert "insufficient quota for cpu" in line and "raise the quota" in line and "\n" not in line
    # Kueue before 0.19 said "Pending" for the same case: the message decides
    assert kueue_outcome(_job(), [_workload("Pending", EXCEEDS)])[0].reason == "Inadmissible"
    missing, _ = kueue_outcome(_job(), [_workload("Misconfigured", "LocalQueue temper-gpu doesn't exist")])
    assert "LocalQueue temper-gpu doesn't exist" in missing.message and "create the LocalQueue" in missing.message
    waiting = ("couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor temper-gpu-node, "
               "64 more needed")
    none, why = kueue_outcome(_job(), [_workload("WaitingForQuota", waiting)])
    assert none is None and why == f"Kueue cannot admit it from LocalQueue temper/temper-gpu yet (WaitingForQuota: {waiting})"
    assert kueue_outcome(_job(), []) == (None, "")  # no Workload yet (or no Kueue): keep waiting
