"""The real ``ClusterApi`` (official client, HTTP) and the sandbox backend against the stand-in cluster.

What runs for real: every client call (create/read/list/delete, pod logs over a chunked HTTP
stream, exec over the v5 websocket channel protocol), the manifests from ``infra.k8s.manifests``,
the stand-in's admission, Job controller, scheduler and kubelet (pods are bwrap'd local processes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.k8s import manifests as m
from infra.k8s.api import ClusterApi
from infra.k8s.errors import KubernetesError
from infra.k8s.options import KubernetesOptions
from infra.sandbox import Limits, get_profile
from infra.sandbox.kubernetes import KubernetesBackend
from tests.conftest import REPO

NS = "temper"


def opts(**over) -> KubernetesOptions:
    base = dict(namespace=NS, priority_class=None, sandbox_priority_class=None, s3_secret=None,
                poll_interval_s=0.2, sandbox_start_timeout_s=30, sandbox_lifetime_s=120)
    return KubernetesOptions(**{**base, **over})


def pod(name: str, command: list[str], **spec) -> k.V1Pod:
    return k.V1Pod(api_version="v1", kind="Pod", metadata=k.V1ObjectMeta(name=name, namespace=NS, labels={"app": name}),
                   spec=k.V1PodSpec(restart_policy="Never", termination_grace_period_seconds=2, containers=[
                       k.V1Container(name=m.MAIN_CONTAINER, image="temper-workload:latest", command=command, env=[
                           k.V1EnvVar(name="MY_POD", value_from=k.V1EnvVarSource(
                               field_ref=k.V1ObjectFieldSelector(field_path="metadata.name"))),
                           k.V1EnvVar(name="GREETING", value="hi $(MY_POD)")])], **spec))


def phase(api: ClusterApi, name: str) -> str | None:
    try:
        return api.read_pod(NS, name).status.phase
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_kubeconfig_works_with_load_config_in_a_fresh_process(k8s_cluster):
    """KUBECONFIG is read when the client is imported, so this runs where a flow would: a new process."""
    k8s_cluster.create_namespace(NS)
    code = ("from infra.k8s.api import ClusterApi, load_config; load_config(); "
            "print(ClusterApi().core.read_namespace('temper').status.phase)")
    env = {**os.environ, "KUBECONFIG": str(k8s_cluster.kubeconfig), "PYTHONPATH": str(REPO)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "Active", out.stderr


def test_cluster_api_crud_conflicts_logs_and_labels(k8s_cluster):
    api = ClusterApi(k8s_cluster.api_client)
    k8s_cluster.create_namespace(NS)

    created = api.create(pod("hello", ["sh", "-c", 'echo "$GREETING from $(hostname)"; echo err >&2; exit 3']))
    assert created.metadata.uid and created.metadata.resource_version
    with pytest.raises(ApiException) as e:
        api.create(pod("hello", ["true"]))
    assert e.value.status == 409 and "AlreadyExists" in e.value.body

    k8s_cluster.wait_for("pod hello finished", lambda: phase(api, "hello") == "Failed")
    done = api.read_pod(NS, "hello")
    term = done.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (3, "Error")
    assert sorted(line for line in api.stream_log(NS, "hello", m.MAIN_CONTAINER)) == ["err", "hi hello from hello"]

    assert [p.metadata.name for p in api.list_pods(NS, "app=hello")] == ["hello"]
    assert api.list_pods(NS, "app!=hello") == [] and api.list_pods(NS, "app in (a,b)") == []
    with pytest.raises(ApiException) as e:
        api.read_job(NS, "nope")
    assert e.value.status == 404
    api.delete("Pod", NS, "hello")
    api.delete("Pod", NS, "hello")  # idempotent: 404 is not an error
    assert k8s_cluster.leftovers(NS) == {}

    with pytest.raises(ApiException) as e:
        api.create(k.V1Pod(metadata=k.V1ObjectMeta(name="x", namespace="missing"), spec=pod("x", ["true"]).spec))
    assert e.value.status == 404 and 'namespaces \\"missing\\" not found' in e.value.body


def test_delete_terminates_a_running_pod_after_sigterm(k8s_cluster):
    api = ClusterApi(k8s_cluster.api_client)
    k8s_cluster.create_namespace(NS)
    script = "trap 'echo got TERM; exit 0' TERM; echo up; while true; do sleep 0.1; done"
    api.create(pod("loop", ["sh", "-c", script]))
    k8s_cluster.wait_for("pod loop running", lambda: phase(api, "loop") == "Running")
    k8s_cluster.wait_for("log line", lambda: _log(k8s_cluster, "loop").startswith("up"))
    k.CoreV1Api(k8s_cluster.api_client).delete_namespaced_pod("loop", NS)  # default grace: the spec's 2 s
    k8s_cluster.wait_for("pod loop gone", lambda: phase(api, "loop") is None, timeout=10)
    assert "got TERM" in _log(k8s_cluster, "loop")
    assert k8s_cluster.processes() == 0


def _log(cluster, name: str) -> str:
    """The kubelet's log file (it outlives the pod object, as on a node until log rotation)."""
    paths = list((cluster.root / "pods").glob(f"{NS}_{name}_*/main/0.log"))
    return paths[0].read_text() if paths else ""


def test_sandbox_backend_runs_programs_in_a_pod_over_exec(k8s_cluster):
    k8s_cluster.create_namespace(NS, service_accounts=())
    backend = KubernetesBackend(ClusterApi(k8s_cluster.api_client), opts(), poll_s=0.1)
    box = backend.create_box(get_profile("python"))
    try:
        box.write_files({"main.py": "import sys, socket\nprint(sys.stdin.read().upper(), socket.gethostname())\n"
                                    "sys.exit(4)\n"})
        result = box.run(["python3", "main.py"], Limits(wall_s=20, cpu_s=20, memory_mb=1024), stdin=b"abc")
        assert result.exit_code == 4 and result.stdout.split() == ["ABC", box.pod], result
        assert box.read_file("main.py").startswith(b"import sys")
        slow = box.run(["python3", "-c", "import time; time.sleep(30)"], Limits(wall_s=1, cpu_s=5, memory_mb=1024))
        assert slow.verdict == "timeout", slow
        assert box.healthy()
    finally:
        box.close()
    k8s_cluster.wait_for("sandbox pod gone", lambda: k8s_cluster.leftovers(NS) == {}, timeout=10)


def test_exec_reports_a_missing_executable_and_a_pod_that_is_not_running(k8s_cluster):
    api = ClusterApi(k8s_cluster.api_client)
    k8s_cluster.create_namespace(NS)
    api.create(pod("idle", ["sleep", "60"]))
    k8s_cluster.wait_for("pod idle running", lambda: phase(api, "idle") == "Running")
    code, out, err = api.exec(NS, "idle", m.MAIN_CONTAINER, ["sh", "-c", "cat; echo $MY_POD >&2; exit 7"], b"in", 10)
    assert (code, out, err) == (7, b"in", b"idle\n")
    with pytest.raises(KubernetesError, match="executable file not found"):
        api.exec(NS, "idle", m.MAIN_CONTAINER, ["no-such-program"], None, 10)
    k8s_cluster.kill(NS, "idle", signal.SIGKILL)
    k8s_cluster.wait_for("pod idle failed", lambda: phase(api, "idle") == "Failed")
    term = api.read_pod(NS, "idle").status.container_statuses[0].state.terminated
    assert term.exit_code == 137
    with pytest.raises((ApiException, KubernetesError)):
        api.exec(NS, "idle", m.MAIN_CONTAINER, ["true"], None, 5)
    start = time.monotonic()
    api.delete("Pod", NS, "idle")
    assert phase(api, "idle") is None and time.monotonic() - start < 5


def test_execs_from_several_threads_leave_the_other_calls_alone(k8s_cluster):
    """A sandbox pool execs from several threads while others read and delete pods on the same ClusterApi.
    The client's ``stream`` swaps ``call_api`` on the ApiClient it is given while it connects: on the shared
    client, a concurrent read went out as a websocket handshake ("Handshake status 200 OK") and overlapping
    swaps could leave it in place for good (every later delete failed: sandbox pods outlived their job)."""
    from concurrent.futures import ThreadPoolExecutor

    api = ClusterApi(k8s_cluster.api_client)
    k8s_cluster.create_namespace(NS)
    for i in range(2):
        api.create(pod(f"busy-{i}", ["sleep", "60"]))
    k8s_cluster.wait_for("pods running", lambda: all(phase(api, f"busy-{i}") == "Running" for i in range(2)))

    def execs(i: int) -> list:
        return [api.exec(NS, f"busy-{i % 2}", m.MAIN_CONTAINER, ["true"], None, 10)[0] for _ in range(6)]

    def reads(_: int) -> list:
        return [api.read_pod(NS, "busy-0").metadata.name for _ in range(40)]

    with ThreadPoolExecutor(8) as pool:
        runs = [pool.submit(execs, i) for i in range(4)] + [pool.submit(reads, i) for i in range(4)]
        results = [r.result() for r in runs]  # a read that went out as a handshake raises here
    assert results[:4] == [[0] * 6] * 4 and all(r == ["busy-0"] * 40 for r in results[4:])
    assert type(api.api_client).call_api is api.api_client.call_api.__func__  # not left swapped
    for i in range(2):
        api.delete("Pod", NS, f"busy-{i}")
    assert phase(api, "busy-0") is None and phase(api, "busy-1") is None


def test_watch_streams_a_pods_life_and_expires_a_compacted_revision(k8s_cluster):
    """The watch API as informers and prefect-kubernetes' observer (kopf) use it, through the official client's
    ``watch.Watch``: the list's resourceVersion, then the pod's ADDED, MODIFIED (bound, running, succeeded) and
    DELETED, filtered by label; a revision older than the server keeps is 410 Expired; discovery lists the kinds."""
    from kubernetes import watch

    k8s_cluster.create_namespace(NS)
    core = k.CoreV1Api(k8s_cluster.api_client)
    core.create_namespaced_pod(NS, pod("other", ["true"]))  # another label: never in the stream
    since = core.list_namespaced_pod(NS, label_selector="app=watched").metadata.resource_version
    core.create_namespaced_pod(NS, pod("watched", ["sh", "-c", "sleep 0.5"]))
    seen = []
    for event in watch.Watch().stream(core.list_namespaced_pod, NS, label_selector="app=watched",
                                      resource_version=since, timeout_seconds=30):
        seen.append((event["type"], event["object"].status.phase))
        if event["type"] == "MODIFIED" and event["object"].status.phase == "Succeeded":
            core.delete_namespaced_pod("watched", NS)
        if event["type"] == "DELETED":
            break
    assert seen[0] == ("ADDED", "Pending") and seen[-1][0] == "DELETED", seen
    assert ("MODIFIED", "Running") in seen and ("MODIFIED", "Succeeded") in seen, seen

    # without a resourceVersion: the objects that exist now, as ADDED
    now = [e for e in watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=1)]
    assert [(e["type"], e["object"].metadata.name) for e in now] == [("ADDED", "other")]

    k8s_cluster.call(lambda: setattr(k8s_cluster.store, "compacted_rv", k8s_cluster.store.last_rv))  # as etcd compacts
    with pytest.raises(ApiException) as e:
        list(watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=since, timeout_seconds=5))
    assert e.value.status == 410 and "too old resource version" in str(e.value)

    resources = k.CoreApi(k8s_cluster.api_client).get_api_versions().versions
    assert resources == ["v1"]
    batch = {r.name for r in k.BatchV1Api(k8s_cluster.api_client).get_api_resources().resources}
    assert batch == {"jobs"}
