"""Pods as real containers on the stand-in's node: the Indexed training Job temper renders (``infra.k8s.manifests``)
with each rank's command swapped for a short probe, as in test_k8s_standin_jobs.py, but every pod a podman pod of
this tree's image with its own network namespace and address.

Asserted through the API and the containers' own output: each pod's ``status.podIP`` is its own bridge address;
the headless Service's names (``MASTER_ADDR``) resolve to rank 0's address, and rank 1 connects to rank 0 over
TCP from its own address (the path the ZeRO-3 rendezvous takes); the pod's securityContext holds inside the
container (uid 1000, read-only root, no capabilities, no-new-privileges) and its limits are the container's
cgroup limits; a deleted rank waiting at the rendezvous stops in seconds, not at its grace period (the image's
init passes SIGTERM on); an evicted rank gets SIGTERM then SIGKILL, its index comes back as a new pod with the same
hostname and a new address, and the names follow it; nothing is left in podman afterwards.
"""

from __future__ import annotations

import ipaddress
import json
import time

from kubernetes import client as k

from infra.jobspec import JobSpec, Resources
from infra.k8s import manifests as m
from infra.k8s.api import ClusterApi
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.options import KubernetesOptions
from tests.k8s_standin.podman import LABEL, podman

NS = "temper"
INDEX = "batch.kubernetes.io/job-completion-index"
PORT = 29555
OPTS = KubernetesOptions(namespace=NS, priority_class=None, sandbox_priority_class=None, s3_secret=None,
                         poll_interval_s=0.2, ttl_seconds_after_finished=1, rendezvous_port=PORT)

# rank 0 serves on the rendezvous port; rank 1 connects to MASTER_ADDR and says who it is. Both report what the
# container is: uid, whether / is writable, capabilities, no_new_privs, cgroup limits, and their own address.
PROBE = r'''
import json, os, socket, sys, time
def resolve(name):  # a pod's name is in DNS once the pod has an address: the peer's may not be yet
    for _ in range(200):
        try:
            return socket.gethostbyname(name)
        except OSError:
            time.sleep(0.1)
    return socket.gethostbyname(name)
def limit(path):
    try:
        return open(path).read().strip()
    except OSError:
        return None
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
try:
    open("/probe", "w"); root_writable = True
except OSError:
    root_writable = False
me = {"rank": os.environ["NODE_RANK"], "uid": os.getuid(), "root_writable": root_writable,
      "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
      "mem_limit": limit("/sys/fs/cgroup/memory/memory.limit_in_bytes") or limit("/sys/fs/cgroup/memory.max"),
      "cpu_quota": limit("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or limit("/sys/fs/cgroup/cpu.max"),
      "hostname": socket.gethostname(), "own_addr": resolve(socket.gethostname()),
      "master": os.environ["MASTER_ADDR"], "master_addr": resolve(os.environ["MASTER_ADDR"])}
if me["rank"] == "0":
    server = socket.create_server(("", %(port)d))
    conn, peer = server.accept()
    me["peer"], me["peer_said"] = peer[0], conn.recv(100).decode()
else:
    for _ in range(200):
        try:
            conn = socket.create_connection((os.environ["MASTER_ADDR"], %(port)d), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    conn.sendall(me["own_addr"].encode())
print("PROBE " + json.dumps(me), flush=True)
''' % {"port": PORT}


def job(name: str, image: str, command: list[str], ttl_s: int) -> list:
    spec = JobSpec(name=name, kind="train", image=image, command=["python", "-c", "pass"], nodes=2, distributed=True,
                   resources=Resources(cpu="500m", memory="256Mi", shm_size="64Mi"), timeout_s=120)
    objs = m.objects_for(spec, OPTS)
    objs[-1].spec.ttl_seconds_after_finished = ttl_s
    objs[-1].spec.template.spec.containers[0].args = command  # after the image's init, as the manifests put it
    objs[-1].spec.template.spec.termination_grace_period_seconds = 1
    return objs


def pods_of(cluster, name: str) -> list[k.V1Pod]:
    return ClusterApi(cluster.api_client).list_pods(NS, f"{m.JOB_LABEL}={name}")


def left_in_podman(cluster) -> list[str]:
    """Containers of the cluster's pods still in podman (the node's own pod, which keeps the bridge up, aside)."""
    rows = podman("ps", "-a", "--pod", "--filter", f"label={LABEL}={cluster.runtime.id}", "--format", "{{.Names}} {{.PodName}}")
    return [row.split()[0] for row in rows.splitlines() if row.split()[1:] != [cluster.runtime.node_pod]]


def containers_of(cluster, pod_prefix: str) -> list[str]:
    """The running podman containers of the cluster's pods whose names start with ``pod_prefix``."""
    rows = podman("ps", "--pod", "--filter", f"label={LABEL}={cluster.runtime.id}", "--format", "{{.Names}} {{.PodName}}")
    return [name for name, *pod in (row.split() for row in rows.splitlines()) if pod and f"-{NS}-{pod_prefix}-" in pod[0]]


def listening(cluster, pod_prefix: str, port: int) -> bool:
    """Whether a container of a pod whose name starts with ``pod_prefix`` listens on ``port`` (its /proc/net/tcp*)."""
    for name in containers_of(cluster, pod_prefix):
        table = podman("exec", name, "cat", "/proc/net/tcp", "/proc/net/tcp6", check=False)
        if any(len(f) > 3 and f[1].endswith(f":{port:04X}") and f[3] == "0A" for f in map(str.split, table.splitlines())):
            return True
    return False


def test_ranks_are_containers_with_own_addresses_that_resolve_and_reach_each_other(k8s_cluster, workload_image):
    k8s_cluster.create_namespace(NS)
    lines: list[str] = []
    launcher = KubernetesLauncher(ClusterApi(k8s_cluster.api_client), OPTS)
    start = time.monotonic()
    attempt = launcher.submit(job("ranks", workload_image, ["python", "-c", PROBE], ttl_s=300), lines.append)
    ips = k8s_cluster.wait_for("both ranks with an address", lambda: {
        p.metadata.annotations[INDEX]: p.status.pod_ip for p in pods_of(k8s_cluster, "ranks")
        if p.status.pod_ip} if len([p for p in pods_of(k8s_cluster, "ranks") if p.status.pod_ip]) == 2 else None, timeout=60)
    launcher.watch(attempt, lines.append)
    print(f"\n2-pod Job of container ranks, submit -> Complete: {time.monotonic() - start:.1f}s; pod IPs {ips}")
    probes = {p["rank"]: p for p in (json.loads(line.split("PROBE ", 1)[1]) for line in lines if "PROBE " in line)}
    assert set(probes) == {"0", "1"}, lines

    node = ipaddress.ip_address(k8s_cluster.node_ip)
    assert ips["0"] != ips["1"] and all(ipaddress.ip_address(ip) != node and not ipaddress.ip_address(ip).is_loopback
                                        and ipaddress.ip_network(f"{node}/16", strict=False).__contains__(
                                            ipaddress.ip_address(ip)) for ip in ips.values()), ips
    for rank, probe in probes.items():
        assert probe["hostname"] == f"ranks-{rank}" and probe["own_addr"] == ips[rank], probe
        assert probe["master"] == "ranks-0.ranks" and probe["master_addr"] == ips["0"], probe
        # restricted securityContext and limits, as the container sees them
        assert probe["uid"] == 1000 and probe["root_writable"] is False, probe
        assert int(probe["cap_eff"], 16) == 0 and probe["no_new_privs"] == "1", probe
        assert probe["mem_limit"] == str(256 * 2**20), probe
        assert probe["cpu_quota"] in ("50000", "50000 100000"), probe
    # rank 1 reached rank 0 from its own address, across the bridge
    assert probes["0"]["peer"] == probes["0"]["peer_said"] == ips["1"], probes
    pod = pods_of(k8s_cluster, "ranks")[0]
    assert pod.status.host_ip == k8s_cluster.node_ip
    k8s_cluster.wait_for("the pods' sandboxes removed", lambda: left_in_podman(k8s_cluster) == [], timeout=30)


def test_an_evicted_rank_is_stopped_and_its_index_comes_back_with_a_new_address(k8s_cluster, workload_image):
    k8s_cluster.create_namespace(NS)
    marker = k8s_cluster.shared_dir / "go"
    # the image's init (PID 1) passes the eviction's SIGTERM on to the rank's shell, which stops
    script = f'while [ ! -e {marker} ]; do sleep 0.1; done; getent hosts "$MASTER_ADDR" "$(hostname)"'
    launcher = KubernetesLauncher(ClusterApi(k8s_cluster.api_client), OPTS)
    lines: list[str] = []
    # a TTL the watch cannot miss: with 1 s, a watch slowed by its log followers under load found the finished
    # Job already deleted (CI, stop 39) and rightly called its outcome unknown
    attempt = launcher.submit(job("evict", workload_image, ["sh", "-c", script], ttl_s=300), lines.append)
    running = k8s_cluster.wait_for("both ranks running", lambda: [
        p for p in pods_of(k8s_cluster, "evict") if p.status.phase == "Running"] if sum(
        p.status.phase == "Running" for p in pods_of(k8s_cluster, "evict")) == 2 else None, timeout=60)
    victim = next(p for p in running if p.metadata.annotations[INDEX] == "1")
    t = time.monotonic()
    k8s_cluster.evict(NS, victim.metadata.name, grace_s=1)
    replacement = k8s_cluster.wait_for("index 1 recreated", lambda: [
        p for p in pods_of(k8s_cluster, "evict") if p.metadata.name != victim.metadata.name
        and p.metadata.annotations[INDEX] == "1" and p.status.phase == "Running" and p.status.pod_ip], timeout=60)[0]
    k8s_cluster.wait_for("the evicted pod gone", lambda: victim.metadata.name not in [
        p.metadata.name for p in pods_of(k8s_cluster, "evict")], timeout=30)
    gone = time.monotonic() - t
    assert gone < 20, gone
    assert replacement.spec.hostname == victim.spec.hostname and replacement.status.pod_ip != victim.status.pod_ip
    def dns_follows() -> bool:
        hosts = (k8s_cluster.root / "hosts").read_text()
        return f"{replacement.status.pod_ip}\tevict-1.evict\n" in hosts and victim.status.pod_ip not in hosts
    try:  # the DNS controller's next tick
        k8s_cluster.wait_for("evict-1's name at the replacement's address", dns_follows, timeout=10)
    except TimeoutError:  # say what the cluster was doing (one failed run here could not be explained afterwards)
        states = [(p.metadata.name, p.status.phase, p.status.reason, p.status.message, p.status.container_statuses)
                  for p in pods_of(k8s_cluster, "evict")]
        raise AssertionError(f"{(k8s_cluster.root / 'hosts').read_text()}\npods: {states}\njob: "
                             f"{k.BatchV1Api(k8s_cluster.api_client).list_namespaced_job(NS).items}") from None
    marker.touch()
    launcher.watch(attempt, lines.append)
    rank0 = next(p for p in running if p.metadata.annotations[INDEX] == "0")
    assert any(rank0.status.pod_ip in line and "evict-0.evict" in line for line in lines), lines  # getent in the ranks
    job_ = k.BatchV1Api(k8s_cluster.api_client).read_namespaced_job("evict", NS)
    assert (job_.status.succeeded, job_.status.failed) == (2, None)  # the disruption was not counted
    k8s_cluster.wait_for("nothing left in podman", lambda: left_in_podman(k8s_cluster) == [], timeout=30)


def test_a_deleted_rank_waiting_at_the_rendezvous_stops_in_seconds_not_at_its_grace_period(k8s_cluster, workload_image):
    """The Job temper renders, unchanged but for one rank of two allowed to run: it waits at the rendezvous for a
    peer that never comes. Deleting the Job (a failed attempt's cleanup) sends its pod SIGTERM: the image's init
    (tini, PID 1) passes it to ``accelerate launch`` and the rank, and the pod is gone in seconds. The control is
    the same line as PID 1 (``command``, which bypasses the image's entrypoint): it ignores SIGTERM and holds the
    node until the grace period's SIGKILL."""
    k8s_cluster.create_namespace(NS)
    api = ClusterApi(k8s_cluster.api_client)
    launcher = KubernetesLauncher(api, OPTS)

    def stop_time(name: str, init: bool, grace_s: int) -> float:
        spec = JobSpec(name=name, kind="train", image=workload_image, command=["python", "-m", "workloads.train", "sft"],
                       nodes=2, distributed=True, resources=Resources(cpu="500m", memory="1Gi", shm_size="64Mi"),
                       timeout_s=300, accelerate_config=f"{OPTS.app_dir}/{OPTS.accelerate_config}")  # as execution.py
        objs = m.objects_for(spec, OPTS)
        pod = objs[-1].spec.template.spec
        assert pod.containers[0].command is None and pod.containers[0].args[:2] == ["accelerate", "launch"]
        objs[-1].spec.parallelism = 1  # rank 1 never starts: rank 0 waits for it at the rendezvous
        objs[-1].spec.ttl_seconds_after_finished = 300  # a rank that failed instead stays to be read
        pod.termination_grace_period_seconds = grace_s
        if not init:
            pod.containers[0].command, pod.containers[0].args = pod.containers[0].args, None
        lines: list[str] = []
        launcher.submit(objs, lines.append)
        k8s_cluster.wait_for(f"{name}: rank 0 running", lambda: any(
            p.status.phase == "Running" for p in pods_of(k8s_cluster, name)), timeout=90)
        # at the rendezvous: rank 0's agent listens on the rendezvous port (its store) and waits for rank 1
        try:
            k8s_cluster.wait_for(f"{name}: waiting at the rendezvous", lambda: listening(k8s_cluster, name, PORT),
                                 timeout=120)
        except TimeoutError:  # say what the rank did instead (its state and last log lines)
            said = [(p.metadata.name, p.status.phase, list(api.stream_log(NS, p.metadata.name, m.MAIN_CONTAINER))[-15:])
                    for p in pods_of(k8s_cluster, name)]
            raise AssertionError(f"{name} never listened on {PORT}: {said}") from None
        start = time.monotonic()
        api.delete("Job", NS, name)
        k8s_cluster.wait_for(f"{name}: its pod gone", lambda: pods_of(k8s_cluster, name) == [], timeout=grace_s + 60)
        return time.monotonic() - start

    with_init = stop_time("term-init", init=True, grace_s=60)
    as_pid1 = stop_time("term-pid1", init=False, grace_s=12)
    print(f"\ndeleted rank at the rendezvous: gone in {with_init:.1f}s with the image's init (grace 60s); "
          f"{as_pid1:.1f}s as PID 1 (grace 12s)")
    assert with_init < 15, with_init
    assert as_pid1 >= 11, as_pid1  # the control: without the init, SIGTERM is ignored until the grace ends
    k8s_cluster.wait_for("nothing left in podman", lambda: left_in_podman(k8s_cluster) == [], timeout=30)
