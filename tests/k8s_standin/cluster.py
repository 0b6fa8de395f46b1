"""The stand-in cluster as one object: API server on 127.0.0.1, control plane loops, one node.

Everything runs on one asyncio event loop in a background thread: the aiohttp API server, and a
control loop that runs, every ``tick_s``, the scheduler, the Job controller, the garbage and TTL
collectors, the DNS writer and the node's kubelet. The controllers work on the API server's
storage directly (the functions the HTTP handlers call, with the same admission and
resourceVersion bumps) rather than through HTTP and watches: the state they see and write is
the state clients read, but informer caches and watch latency are not imitated.

The test side talks to it like to a cluster: ``api_client`` (the official client, configured
for ``http://127.0.0.1:<port>``) and ``kubeconfig`` (for ``load_config()``/``KUBECONFIG``).
Fault injection: ``evict`` (the real policy/v1 Eviction, through the API), ``kill`` (a rank's
processes die, as in a crash or an OOM kill), ``hold_scheduling`` (the scheduler binds nothing
for a while). ``leftovers`` lists what is left in a namespace, through the API.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
from pathlib import Path

import yaml
from aiohttp import web
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from tests.k8s_standin.controllers import Dns, GarbageCollector, Scheduler, TtlController
from tests.k8s_standin.jobs import JobController
from tests.k8s_standin.kubelet import Image, Kubelet
from tests.k8s_standin.kueue import KueueController
from tests.k8s_standin.server import ApiServer
from tests.k8s_standin.store import Store

log = logging.getLogger(__name__)
NODE = "standin-node-1"
LEFTOVER_KINDS = ("Pod", "Job", "Service", "NetworkPolicy")


def workload_image(repo: Path, venv: Path) -> Image:
    """What ``docker/Dockerfile`` builds, from this checkout: the code at /app, the venv at /opt/venv.

    The image has temper pip-installed; here PYTHONPATH points at the checkout instead.
    """
    return Image(env={"PATH": "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                      "PYTHONPATH": "/app", "HOME": "/tmp", "HF_HOME": "/tmp/hf",
                      "TORCH_EXTENSIONS_DIR": "/tmp/torch_extensions", "PYTHONUNBUFFERED": "1",
                      "PYTHONDONTWRITEBYTECODE": "1", "TEMPER_HOME": "/tmp/temper", "TEMPER_BACKEND": "kubernetes"},
                 workdir="/app", binds={"/app": str(repo), "/opt/venv": str(venv)})


class StandinCluster:
    def __init__(self, root: Path, images: dict[str, Image], cpu: str = "4", memory: str = "16Gi",
                 tick_s: float = 0.05, containers: bool = False) -> None:
        """``containers``: the node runs pods as podman containers (``podman.PodmanRuntime``), each with its own
        address; the API server then listens on the node's address (the bridge's gateway), where pods reach it."""
        self.root, self.tick_s = Path(root), tick_s
        self.root.mkdir(parents=True, exist_ok=True)
        self.store = Store()
        hosts = self.root / "hosts"
        self.errors: list[str] = []
        self.shared_dir = Path(tempfile.mkdtemp(prefix="k8s-standin-", dir="/var/tmp"))
        self.runtime, self.node_ip = None, "127.0.0.1"
        if containers:
            from tests.k8s_standin.podman import PodmanRuntime

            # every pod sees the shared dir at the same path (as under bwrap), whatever uid it runs as
            self.shared_dir.chmod(0o1777)
            self.runtime = PodmanRuntime(shared_binds={str(self.shared_dir): str(self.shared_dir)})
            self.node_ip = self.runtime.start()
        self.kubelet = Kubelet(self.store, NODE, self.root, images, hosts, runtime=self.runtime, node_ip=self.node_ip)
        self.server = ApiServer(self.store, self.kubelet)
        self.scheduler = Scheduler(self.store, self.server.bind)
        self.loops = [self.scheduler, KueueController(self.store), JobController(self.store), GarbageCollector(self.store),
                      TtlController(self.store),
                      Dns(self.store, hosts, unassigned=None if containers else "127.0.0.1"), self.kubelet]
        self._bootstrap(cpu, memory)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="k8s-standin", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the stand-in API server did not start")
        self.host = f"http://{self.node_ip}:{self.port}"
        self.kubeconfig = self.root / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": self.host}}],
            "users": [{"name": "standin", "user": {"token": "standin-has-no-auth"}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin", "namespace": "default"}}],
        }))
        conf = k.Configuration(host=self.host)
        self.api_client = k.ApiClient(conf)

    def _bootstrap(self, cpu: str, memory: str) -> None:
        self.store.create("Namespace", "", {"metadata": {"name": "default"}, "status": {"phase": "Active"}})
        self.store.create("ServiceAccount", "default", {"metadata": {"name": "default"}})
        self.store.create("Node", "", {
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux"}},
            "spec": {}, "status": {"capacity": {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"},
                                   "allocatable": {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"},
                                   "conditions": [{"type": "Ready", "status": "True"}],
                                   "addresses": [{"type": "InternalIP", "address": self.node_ip}]}})

    # --- the thread -----------------------------------------------------------------------------
    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        # Go's net/http (kube-apiserver) allows 1 MiB of request line + headers; aiohttp 8 KiB. An exec
        # URL carries the whole command (temper's sandbox executor source is ~30 KB url-encoded).
        runner = web.AppRunner(self.server.app, access_log=None,
                               max_line_size=1 << 20, max_field_size=1 << 20)
        self.loop.run_until_complete(runner.setup())
        sock = socket.socket()
        sock.bind((self.node_ip, 0))
        self.port = sock.getsockname()[1]
        self.loop.run_until_complete(web.SockSite(runner, sock).start())
        self._control = self.loop.create_task(self._control_loop())
        self._runner = runner
        self._ready.set()
        self.loop.run_forever()

    async def _control_loop(self) -> None:
        while True:
            for part in self.loops:
                try:
                    part.sync()
                except Exception:  # a controller bug must show in the test, not kill the loop
                    self.errors.append(f"{type(part).__name__}: {traceback.format_exc()}")
                    log.error("stand-in %s failed:\n%s", type(part).__name__, self.errors[-1])
            await asyncio.sleep(self.tick_s)

    def call(self, fn, *args, timeout: float = 30):
        """Run ``fn(*args)`` on the cluster's loop (the only thread that touches its state)."""
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    # --- setup helpers --------------------------------------------------------------------------
    def create_namespace(self, name: str, service_accounts: tuple[str, ...] = ("temper-workload",),
                         priority_classes: tuple[str, ...] = ()) -> None:
        core = k.CoreV1Api(self.api_client)
        core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name=name)))
        for sa in service_accounts:
            core.create_namespaced_service_account(name, k.V1ServiceAccount(metadata=k.V1ObjectMeta(name=sa)))
        sched = k.SchedulingV1Api(self.api_client)
        for pc in priority_classes:
            try:
                sched.create_priority_class(k.V1PriorityClass(metadata=k.V1ObjectMeta(name=pc), value=1000))
            except ApiException as e:
                if e.status != 409:  # cluster-scoped: another namespace's setup may have made it
                    raise

    # --- fault injection ------------------------------------------------------------------------
    def evict(self, namespace: str, pod_name: str, grace_s: int | None = None) -> None:
        """The Eviction API (what ``kubectl drain`` and the node-pressure-free disruptions use)."""
        body = k.V1Eviction(metadata=k.V1ObjectMeta(name=pod_name, namespace=namespace),
                            delete_options=k.V1DeleteOptions(grace_period_seconds=grace_s) if grace_s is not None else None)
        k.CoreV1Api(self.api_client).create_namespaced_pod_eviction(pod_name, namespace, body)

    def kill(self, namespace: str, pod_name: str, sig: int = signal.SIGKILL) -> None:
        """One rank fails: its container's processes get ``sig`` (exit code 128+sig)."""
        self.call(self.kubelet.kill, namespace, pod_name, sig)

    def hold_scheduling(self, seconds: float) -> None:
        self.call(self.scheduler.hold, seconds)

    # --- inspection -----------------------------------------------------------------------------
    def leftovers(self, namespace: str) -> dict[str, list[str]]:
        """Pods, Jobs, Services and NetworkPolicies left in ``namespace``, read through the API."""
        core, batch, net = k.CoreV1Api(self.api_client), k.BatchV1Api(self.api_client), k.NetworkingV1Api(self.api_client)
        found = {"Pod": core.list_namespaced_pod(namespace).items, "Job": batch.list_namespaced_job(namespace).items,
                 "Service": core.list_namespaced_service(namespace).items,
                 "NetworkPolicy": net.list_namespaced_network_policy(namespace).items}
        return {kind: sorted(o.metadata.name for o in items) for kind, items in found.items() if items}

    def wait_for(self, what: str, predicate, timeout: float = 30, poll: float = 0.1):
        """Poll ``predicate()`` until it returns something truthy; TimeoutError naming ``what``."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = predicate()
            if value:
                return value
            time.sleep(poll)
        raise TimeoutError(f"stand-in cluster: {what} not reached in {timeout:.0f}s")

    def processes(self) -> int:
        """Containers still running on the node (for asserting nothing is left behind)."""
        return self.call(lambda: sum(1 for r in self.kubelet.pods.values()
                                     for p in r.procs.values() if p.returncode is None))

    def stop(self) -> None:
        def kill_all():
            for run in self.kubelet.pods.values():
                for proc in run.procs.values():
                    if proc.returncode is None:
                        try:
                            os.killpg(proc.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
        try:
            self.call(kill_all)
            self._control.get_loop().call_soon_threadsafe(self._control.cancel)
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.api_client.close()
            if self.runtime is not None:
                self.runtime.cleanup()
            shutil.rmtree(self.shared_dir, ignore_errors=True)
