"""The stand-in cluster's pure rules (tests/k8s_standin), checked against Kubernetes' documented behaviour."""

from __future__ import annotations

import pytest

from tests.k8s_standin.admission import admit_job, qos_class
from tests.k8s_standin.jobs import _index_set, _parse_index_set, match_policy
from tests.k8s_standin.kubelet import expand
from tests.k8s_standin.store import ApiError, Store, matches, parse_selector


def test_label_selectors_as_the_api_server_parses_them():
    labels = {"app": "x", "tier": "web"}
    assert matches(labels, parse_selector("app=x,tier in (web, db)"))
    assert matches(labels, parse_selector("app==x,!missing,tier"))
    assert not matches(labels, parse_selector("app!=x"))
    assert not matches(labels, parse_selector("tier notin (web)"))
    assert matches({}, parse_selector("app!=x")) and matches(labels, parse_selector(""))
    with pytest.raises(ApiError) as e:
        parse_selector("app=x,=y")
    assert e.value.code == 400


def test_dependent_env_expansion():
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)-$(C)-$$(A)", env) == "1-two-$(C)-$(A)"  # unknown stays, $$ escapes


def test_completed_indexes_round_trip():
    assert _index_set({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert _parse_index_set("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert _parse_index_set("") == set()


POLICY = {"rules": [
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [0]}},
]}


def failed_pod(code: int, conditions=()) -> dict:
    return {"metadata": {"namespace": "ns", "name": "p"}, "status": {
        "conditions": list(conditions),
        "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": code}}}]}}


def test_pod_failure_policy_first_matching_rule_wins():
    evicted = failed_pod(143, [{"type": "DisruptionTarget", "status": "True"}])
    assert match_policy(POLICY, evicted)[0] == "Ignore"
    action, why = match_policy(POLICY, failed_pod(1))
    assert action == "FailJob" and why == "Container main for pod ns/p failed with exit code 1 matching FailJob rule at index 1"
    assert match_policy(POLICY, failed_pod(0))[0] == "Count"  # exit 0 is never matched by onExitCodes
    assert match_policy(None, failed_pod(1))[0] == "Count"


def test_job_defaults_and_validation():
    job = {"metadata": {"name": "j", "uid": "u1"}, "spec": {"completionMode": "Indexed", "completions": 2,
                                                           "template": {"spec": {"restartPolicy": "Never"}}}}
    admit_job(job)
    assert job["spec"]["backoffLimit"] == 6 and job["spec"]["parallelism"] == 1
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": "u1"}}
    assert job["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "j"
    bad = {"metadata": {"name": "j", "uid": "u"}, "spec": {"completionMode": "Indexed",
                                                           "template": {"spec": {"restartPolicy": "Never"}}}}
    with pytest.raises(ApiError, match="spec.completions: Required value"):
        admit_job(bad)
    always = {"metadata": {"name": "j", "uid": "u"}, "spec": {"template": {"spec": {"restartPolicy": "Always"}}}}
    with pytest.raises(ApiError, match="restartPolicy: Unsupported value"):
        admit_job(always)


def test_qos_classes():
    def pod(res):
        return {"spec": {"containers": [{"resources": res}]}}
    assert qos_class(pod({})) == "BestEffort"
    assert qos_class(pod({"limits": {"cpu": "1", "memory": "1Gi"}})) == "Guaranteed"  # requests default to limits
    assert qos_class(pod({"requests": {"cpu": "1"}})) == "Burstable"


def test_store_conflicts_versions_and_finalizers():
    store = Store()
    store.create("Namespace", "", {"metadata": {"name": "ns"}})
    with pytest.raises(ApiError) as e:
        store.create("ConfigMap", "missing", {"metadata": {"name": "c"}})
    assert (e.value.code, e.value.message) == (404, 'namespaces "missing" not found')
    obj = store.create("ConfigMap", "ns", {"metadata": {"name": "c", "finalizers": ["x"]}})
    stale = obj["metadata"]["resourceVersion"]
    store.replace({**obj, "data": {"k": "v"}})
    with pytest.raises(ApiError) as e:
        store.replace({**obj, "data": {"k": "w"}}, check_version=stale)
    assert e.value.code == 409 and e.value.reason == "Conflict"
    with pytest.raises(ApiError) as e:
        store.create("ConfigMap", "ns", {"metadata": {"name": "c"}})
    assert e.value.reason == "AlreadyExists"
    store.delete("ConfigMap", "ns", "c")
    held = store.get("ConfigMap", "ns", "c")  # the finalizer holds it
    assert held["metadata"]["deletionTimestamp"]
    held["metadata"]["finalizers"] = []
    store.replace(held)
    assert store.find("ConfigMap", "ns", "c") is None


def _pod(name: str, ip: str | None, hostname: str | None = None, subdomain: str | None = None, deleting: bool = False,
         labels: dict | None = None) -> dict:
    meta = {"name": name, "namespace": "ns", "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"hostname": hostname, "subdomain": subdomain},
            "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_dns_maps_names_to_pod_addresses_and_follows_an_evicted_index(tmp_path):
    from tests.k8s_standin.controllers import Dns

    store = Store()
    store.create("Namespace", "", {"metadata": {"name": "ns"}})
    store.create("Service", "ns", {"metadata": {"name": "job"}, "spec": {
        "clusterIP": "None", "selector": {"j": "job"}, "publishNotReadyAddresses": True}})
    store.create("Pod", "ns", _pod("job-0-a", "10.88.0.5", "job-0", "job", labels={"j": "job"}))
    store.create("Pod", "ns", _pod("job-1-b", "10.88.0.6", "job-1", "job", deleting=True, labels={"j": "job"}))
    store.create("Pod", "ns", _pod("job-1-c", "10.88.0.7", "job-1", "job", labels={"j": "job"}))  # its replacement
    store.create("Pod", "ns", _pod("starting", None, "starting"))  # no address yet
    names = Dns(store, tmp_path / "hosts", unassigned=None).names()
    assert names["job-0.job"] == names["job-0.job.ns.svc.cluster.local"] == names["job-0"] == "10.88.0.5"
    assert names["job-1.job"] == names["job-1"] == "10.88.0.7"  # the replacement, not the terminating pod
    assert "starting" not in names
    # pods on this machine's network (bwrap): a name whose pod has no address yet is loopback, as the pod will be
    assert Dns(store, tmp_path / "hosts2").names()["starting"] == "127.0.0.1"


def test_the_container_runtime_applies_the_restricted_security_context_and_limits(tmp_path):
    from infra.k8s import manifests as m
    from tests.k8s_standin.podman import PodmanRuntime

    runtime = PodmanRuntime()
    runtime._image_users = {"img": "1000:1000", "rootimg": ""}  # what `podman image inspect` says, without podman
    pod = {"spec": {"securityContext": m.to_dict(m.restricted_pod_security())}}
    c = {"image": "img", "securityContext": m.to_dict(m.restricted_container_security()),
         "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}
    argv = runtime.run_argv("sb", "sb-main-0", c, pod, tmp_path / "env", [("/node/tmp", "/tmp", False)],
                            [("/dev/shm", "64Mi")], ["python"], ["-m", "x"], tmp_path / "hosts")
    line = " ".join(argv)
    for flags in ("--pod sb", "--pull never", "--user 1000:1000", "--read-only --read-only-tmpfs=false", "--cap-drop ALL",
                  "--security-opt no-new-privileges", "--cpus 0.5", f"--memory {256 * 2**20}", "-v /node/tmp:/tmp:rw",
                  f"-v {tmp_path / 'hosts'}:/etc/hosts:ro", "type=tmpfs,destination=/dev/shm,tmpfs-mode=1777,tmpfs-size=67108864",
                  "--group-add 1000", '--entrypoint ["python"] img -m x'):
        assert flags in line, (flags, line)
    assert "seccomp=unconfined" not in line  # RuntimeDefault: podman's default profile
    with pytest.raises(ValueError, match="runAsNonRoot and image will run as root"):
        runtime.run_argv("sb", "n", {**c, "image": "rootimg", "securityContext": {"runAsNonRoot": True}}, {"spec": {}},
                         tmp_path / "env", [], [], [], [], tmp_path / "hosts")
