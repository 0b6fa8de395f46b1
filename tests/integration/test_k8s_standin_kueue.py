"""Kueue admission on the stand-in cluster, through the launcher, with the gpu-cluster overlay's queue.

The ResourceFlavor, ClusterQueue and LocalQueue are the ones ``k8s/overlays/gpu-cluster/kueue.yaml``
declares, created through the API (the official client's CustomObjectsApi), with the ClusterQueue's
quota shrunk to this one-node stand-in (1 CPU, 2Gi, no GPU) and the node labelled and tainted like
a GPU node. Jobs are the manifests temper renders (queue label, suspended) with trivial ``sh``
ranks, so each test runs in seconds. What the stand-in's Kueue models: tests/k8s_standin/kueue.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.jobspec import JobSpec, Resources
from infra.k8s import manifests as m
from infra.k8s.api import ClusterApi
from infra.k8s.errors import JobFailed
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.options import KubernetesOptions
from tests.k8s_standin.cluster import NODE
from tests.k8s_standin.kueue import GROUP, VERSION
from tests.unit.test_k8s_static import K8S, RENDERED, find

NS = "temper"
OVERLAY = RENDERED["overlays/gpu-cluster"]
OVERLAY_OPTS = yaml.safe_load(find(OVERLAY, "ConfigMap", "temper-k8s-options")["data"]["options.yaml"])
OPTS = KubernetesOptions(namespace=NS, priority_class="temper-training", sandbox_priority_class=None, s3_secret=None,
                         poll_interval_s=0.2, ttl_seconds_after_finished=60, rendezvous_port=29556,
                         queue_name=OVERLAY_OPTS["queue_name"], node_selector=OVERLAY_OPTS["node_selector"],
                         tolerations=OVERLAY_OPTS["tolerations"])
QUOTA = {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "0"}


def kueue_objects() -> list[dict]:
    """The overlay's Kueue objects, the ClusterQueue's quota sized to the stand-in's node."""
    docs = [d for d in yaml.safe_load_all((K8S / "overlays/gpu-cluster/kueue.yaml").read_text()) if d]
    cq = next(d for d in docs if d["kind"] == "ClusterQueue")
    for res in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
        res["nominalQuota"] = QUOTA[res["name"]]
    return docs


def setup_queue(cluster) -> None:
    cluster.create_namespace(NS)
    core, custom = k.CoreV1Api(cluster.api_client), k.CustomObjectsApi(cluster.api_client)
    labels = find(OVERLAY, "Namespace", "temper")["metadata"]["labels"]
    core.patch_namespace(NS, {"metadata": {"labels": {"temper.dev/kueue-tenant": labels["temper.dev/kueue-tenant"]}}})
    sched = k.SchedulingV1Api(cluster.api_client)
    for pc in (d for d in OVERLAY if d["kind"] == "PriorityClass"):
        sched.create_priority_class(k.V1PriorityClass(metadata=k.V1ObjectMeta(name=pc["metadata"]["name"]), value=pc["value"]))
    flavor = next(d for d in kueue_objects() if d["kind"] == "ResourceFlavor")["spec"]
    core.patch_node(NODE, {"metadata": {"labels": flavor["nodeLabels"]}, "spec": {"taints": flavor["nodeTaints"]}})
    for doc in kueue_objects():
        plural = doc["kind"].lower() + "s"
        if doc["metadata"].get("namespace"):
            custom.create_namespaced_custom_object(GROUP, VERSION, doc["metadata"]["namespace"], plural, doc)
        else:
            custom.create_cluster_custom_object(GROUP, VERSION, plural, doc)


def objects(name: str, script: str, cpu: str = "500m", nodes: int = 2, kind: str = "train",
            priority: str | None = None) -> list:
    """What one attempt submits (queue label, suspended), each rank running ``sh -c script``."""
    spec = JobSpec(name=name, kind=kind, command=["python", "-c", "pass"], nodes=nodes, distributed=nodes > 1,
                   resources=Resources(cpu=cpu, memory="128Mi", shm_size="16Mi"), timeout_s=60)
    objs = m.objects_for(spec, OPTS)
    job = objs[-1]
    job.spec.template.spec.containers[0].args = ["sh", "-c", script]
    job.spec.template.spec.termination_grace_period_seconds = 1
    if priority:
        job.spec.template.spec.priority_class_name = priority
    return objs


def launcher(cluster) -> KubernetesLauncher:
    return KubernetesLauncher(ClusterApi(cluster.api_client), OPTS)


def workload(cluster, job: str) -> dict | None:
    """The Job's Workload, read as a client reads it (CustomObjectsApi, by Kueue's job-uid label)."""
    uid = k.BatchV1Api(cluster.api_client).read_namespaced_job(job, NS).metadata.uid
    items = k.CustomObjectsApi(cluster.api_client).list_namespaced_custom_object(
        GROUP, VERSION, NS, "workloads", label_selector=f"kueue.x-k8s.io/job-uid={uid}")["items"]
    return items[0] if items else None


def condition(wl: dict | None, type_: str) -> dict:
    return next((c for c in ((wl or {}).get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def test_a_job_the_cluster_queue_can_never_admit_fails_at_once_naming_job_queue_and_resource(k8s_cluster):
    setup_queue(k8s_cluster)
    lines: list[str] = []
    start = time.monotonic()
    cancel = threading.Event()  # without the Workload check the launcher would wait forever (the Job stays suspended)
    timer = threading.Timer(20, cancel.set)
    timer.start()
    with pytest.raises(JobFailed) as e:  # a 2-CPU pod against a nominal quota of 1 CPU
        launcher(k8s_cluster).run(JobSpec(name="toobig", kind="eval", command=["true"], nodes=1,
                                          resources=Resources(cpu="2", memory="128Mi"), timeout_s=60), lines.append,
                                  cancel=cancel)
    timer.cancel()
    took = time.monotonic() - start
    line = str(e.value)
    print(f"\nnever-admissible Job failed by the launcher after {took:.2f}s: {line}")
    assert e.value.reason == "Inadmissible" and not e.value.retriable and "\n" not in line
    assert line.startswith("job 'toobig': Inadmissible: Kueue cannot admit it from LocalQueue temper/temper-gpu")
    assert "ExceedsMaxQuota" in line and "insufficient quota for cpu in flavor temper-gpu-node" in line
    assert "current podset request (2) > maximum capacity (1)" in line
    assert took < 10  # not activeDeadlineSeconds (60 s), not unschedulable_after_s
    k8s_cluster.wait_for("the Job and its Workload gone", lambda: k8s_cluster.leftovers(NS) == {} and not
                         k.CustomObjectsApi(k8s_cluster.api_client).list_namespaced_custom_object(
                             GROUP, VERSION, NS, "workloads")["items"])


def test_a_job_waiting_for_quota_is_admitted_when_the_first_finishes(k8s_cluster):
    """2 x 500m fills the 1-CPU quota: the second gang waits, suspended with no pods, then runs."""
    setup_queue(k8s_cluster)
    go, done = k8s_cluster.shared_dir / "go", k8s_cluster.shared_dir / "first-done"
    first = objects("first", f"while [ ! -e {go} ]; do sleep 0.1; done; touch {done}")
    second = objects("second", f'test -e {done} && echo "first was done"')
    logs: dict[str, list[str]] = {"first": [], "second": []}
    run_first = launcher(k8s_cluster).submit(first, logs["first"].append)
    k8s_cluster.wait_for("first admitted", lambda: condition(workload(k8s_cluster, "first"), "Admitted").get("status") == "True")
    run_second = launcher(k8s_cluster).submit(second, logs["second"].append)
    waiting = k8s_cluster.wait_for("second's Workload refused for now", lambda: (
        c := condition(workload(k8s_cluster, "second"), "QuotaReserved")).get("status") == "False" and c)
    assert waiting["reason"] == "WaitingForQuota"
    assert waiting["message"] == ("couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor "
                                  "temper-gpu-node, 1 more needed")
    batch = k.BatchV1Api(k8s_cluster.api_client)
    assert batch.read_namespaced_job("second", NS).spec.suspend is True
    assert ClusterApi(k8s_cluster.api_client).list_pods(NS, f"{m.JOB_LABEL}=second") == []
    cq = k.CustomObjectsApi(k8s_cluster.api_client).get_cluster_custom_object(GROUP, VERSION, "clusterqueues", "temper")
    assert (cq["status"]["admittedWorkloads"], cq["status"]["pendingWorkloads"]) == (1, 1)
    assert {r["name"]: r["total"] for r in cq["status"]["flavorsUsage"][0]["resources"]}["cpu"] == "1"

    start = time.monotonic()
    go.touch()
    second_thread = threading.Thread(target=launcher(k8s_cluster).watch, args=(run_second, logs["second"].append))
    second_thread.start()
    launcher(k8s_cluster).watch(run_first, logs["first"].append)
    second_thread.join(30)
    assert not second_thread.is_alive()
    print(f"\nqueued gang: admitted and complete {time.monotonic() - start:.2f}s after the first was let run")
    assert sum("first was done" in line for line in logs["second"]) == 2, logs["second"]  # both ranks ran after it
    assert any("Kueue cannot admit it from LocalQueue temper/temper-gpu yet (WaitingForQuota" in line
               for line in logs["second"]), logs["second"]
    # Kueue marks the Workload Finished after the Job's Complete condition (its next pass, as on a cluster)
    wl = k8s_cluster.wait_for("second's Workload finished", lambda: (
        w := workload(k8s_cluster, "second")) and condition(w, "Finished").get("reason") == "Succeeded" and w)
    assert condition(wl, "Admitted")["status"] == "True"
    (assignment,) = wl["status"]["admission"]["podSetAssignments"]
    assert assignment == {"name": "main", "count": 2, "flavors": {"cpu": "temper-gpu-node", "memory": "temper-gpu-node"},
                          "resourceUsage": {"cpu": "1", "memory": "256Mi"}}
    pod_spec = batch.read_namespaced_job("second", NS).spec.template.spec
    assert pod_spec.node_selector == {"nvidia.com/gpu.present": "true"}  # the flavor's nodeLabels


def test_higher_priority_is_admitted_first_and_the_api_refuses_a_bad_cluster_queue(k8s_cluster):
    setup_queue(k8s_cluster)
    go = k8s_cluster.shared_dir / "go"
    order = k8s_cluster.shared_dir / "order"
    hold = launcher(k8s_cluster).submit(objects("hold", f"while [ ! -e {go} ]; do sleep 0.1; done"), lambda _: None)
    k8s_cluster.wait_for("hold admitted", lambda: condition(workload(k8s_cluster, "hold"), "Admitted").get("status") == "True")
    # eval (temper-eval) queued before training (temper-training); each needs the whole 1-CPU quota
    low = launcher(k8s_cluster).submit(objects("low", f"echo low >> {order}", cpu="1", nodes=1, kind="eval",
                                               priority="temper-eval"), lambda _: None)
    high = launcher(k8s_cluster).submit(objects("high", f"echo high >> {order}", cpu="1", nodes=1, kind="eval",
                                                 priority="temper-training"), lambda _: None)
    k8s_cluster.wait_for("both waiting", lambda: all(condition(workload(k8s_cluster, j), "QuotaReserved").get("status")
                                                     == "False" for j in ("low", "high")))
    assert workload(k8s_cluster, "high")["spec"]["priority"] > workload(k8s_cluster, "low")["spec"]["priority"]
    go.touch()
    for attempt in (hold, high, low):
        launcher(k8s_cluster).watch(attempt, lambda _: None)
    assert order.read_text().split() == ["high", "low"]

    custom = k.CustomObjectsApi(k8s_cluster.api_client)
    bad = next(d for d in kueue_objects() if d["kind"] == "ClusterQueue")
    bad["metadata"]["name"] = "negative"
    bad["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "-1"
    with pytest.raises(ApiException) as e:
        custom.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", bad)
    assert e.value.status == 403 and json.loads(e.value.body)["message"] == (
        'admission webhook "vclusterqueue.kb.io" denied the request: spec.resourceGroups[0].flavors[0].resources[0]'
        '.nominalQuota: Invalid value: "-1": must be greater than or equal to 0')
