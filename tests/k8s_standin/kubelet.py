"""The node agent: runs the pods bound to its node (as bwrap processes or podman containers) and reports on them.

What it does as the kubelet does:

- for each pod bound to its node: resolves every container's environment in Kubernetes order
  (``podenv.py``), expands ``$(VAR)`` in ``command``/``args``, and starts them;
- a missing Secret/ConfigMap leaves the container waiting with ``CreateContainerConfigError``
  (retried, as the kubelet retries); an image it does not know -> ``ErrImagePull``;
- writes the pod status back: ``Pending`` + ``ContainerCreating`` -> ``Running`` (container
  ``running``, ``Ready``) -> ``Succeeded``/``Failed`` with each container's ``terminated`` state
  (``exitCode``, ``Completed``/``Error``, 128+signal for a signal), restarts for
  ``restartPolicy: OnFailure/Always`` (``restartCount``, ``lastState``), ``FallbackToLogsOnError``
  termination messages, and ``activeDeadlineSeconds`` (``Failed``/``DeadlineExceeded``);
- logs: stdout+stderr of each container go to ``<root>/pods/<ns>_<pod>_<uid>/<container>/0.log``
  (the kubelet's own layout); the API server's ``pods/log`` reads them;
- deletion: a pod marked for deletion gets SIGTERM, then SIGKILL after its grace period, sent to
  the container's PID 1 as a runtime sends them (the command runs as PID 1 of its own PID
  namespace, so it ignores signals it has no handler for, as in a container); its
  final status is written, then the kubelet deletes it for good (grace 0), as a kubelet does.

Two container runtimes (``runtime``):

- bwrap processes (the default, ``make test``): images are not pulled or unpacked. An ``Image``
  names what the image would provide (environment such as PATH, a working dir, and directories it
  would contain, bound from this machine). Each container is a ``bwrap`` process tree with its own
  PID and UTS namespaces (hostname = the pod's ``hostname`` or name), a root made of this machine's
  directories, the pod's ``emptyDir``/``configMap``/``secret`` volumes bound at their mount paths,
  and an ``/etc/hosts`` the stand-in keeps (``controllers.Dns``): every pod shares this machine's
  network namespace (like ``hostNetwork: true``), so every name resolves to 127.0.0.1. Cut: no
  cgroups, so resource limits are not enforced (no OOMKilled); ``securityContext`` (runAsUser,
  read-only root, capabilities, seccomp) is not applied.
- real containers (``podman.PodmanRuntime``, ``make test-containers``): each pod is a podman pod
  with its own network namespace and address on the ``podman`` bridge (``status.podIP``), each
  container a runc container of the image the pod names, with its securityContext and limits; the
  same volumes and ``/etc/hosts``, now mapping names to pod addresses. See that module.

Cut in both, and said where it matters: ``emptyDir`` with ``medium: Memory`` is a directory on
disk (a tmpfs in containers); no probes, init containers or sidecars; volumes other than
emptyDir/configMap/secret fail the pod with CreateContainerConfigError; a deleted pod's emptyDirs
and logs stay on the node's disk (under the cluster's root, for tests to inspect) where a kubelet
removes them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.k8s_standin import podenv
from tests.k8s_standin.podenv import POD_IP, ConfigError, ImageError, expand, resolve_env
from tests.k8s_standin.store import ApiError, Store, now

__all__ = ["POD_IP", "ConfigError", "Image", "ImageError", "Kubelet", "expand"]


@dataclass
class Image:
    """What an image would provide, since images are not run here."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    binds: dict[str, str] = field(default_factory=dict)  # path in the container -> path on this machine


@dataclass
class Running:
    """One pod's containers on this node."""

    pod_key: tuple[str, str]
    uid: str
    dir: Path
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    task: asyncio.Task | None = None
    killing: bool = False
    started: float = field(default_factory=time.monotonic)
    ip: str = POD_IP
    sandbox: str | None = None  # the container runtime's pod (its network namespace), when there is one
    containers: dict[str, str] = field(default_factory=dict)  # container name -> the runtime's name


class Kubelet:
    def __init__(self, store: Store, node: str, root: Path, images: dict[str, Image], hosts_file: Path,
                 base_env: dict[str, str] | None = None, runtime=None, node_ip: str = POD_IP) -> None:
        """``runtime``: None runs containers as bwrap processes on this machine's network (``images`` says what
        each image would provide); a ``podman.PodmanRuntime`` runs them as real containers of the images the
        pods name, each pod in its own network namespace."""
        self.store, self.node, self.root, self.images, self.hosts_file = store, node, root, images, hosts_file
        self.base_env = base_env or {"PATH": "/usr/local/bin:/usr/bin:/bin"}
        self.pods: dict[tuple[str, str], Running] = {}
        self.runtime, self.node_ip = runtime, node_ip

    # --- API server's view ------------------------------------------------------------------------
    def log_path(self, pod: dict, container: str) -> Path | None:
        run = self.pods.get((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        return run.dir / container / "0.log" if run else None

    def container_running(self, ns: str, name: str, container: str) -> bool:
        run = self.pods.get((ns, name))
        proc = run.procs.get(container) if run else None
        return proc is not None and proc.returncode is None

    def exec_argv(self, pod: dict, container: str, command: list[str]) -> tuple[list[str], dict, str]:
        """A process in the container's mounts, hostname, environment and working dir."""
        spec = next(c for c in pod["spec"]["containers"] if c["name"] == container)
        run = self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])]
        if self.runtime is not None:
            from tests.k8s_standin.podman import podman_env
            return self.runtime.exec_argv(run.containers[container], command, spec.get("workingDir")), podman_env(), "/"
        env = self._env(pod, spec)
        argv, cwd = self._sandbox(pod, spec, run), spec.get("workingDir") or self._image(spec).workdir
        return argv + ["--chdir", cwd, "--", *command], env, "/"

    # --- fault injection --------------------------------------------------------------------------
    def kill(self, ns: str, name: str, sig: int = signal.SIGKILL) -> None:
        """A rank dies on its own (crash, OOM killer): the container's processes get ``sig``."""
        run = self.pods.get((ns, name))
        if run is None:
            raise ApiError(404, "NotFound", f'pod "{name}" is not running on node {self.node}')
        self._signal(run, sig)

    def _signal(self, run: Running, sig: int) -> None:
        """Every running container of the pod gets ``sig`` at its PID 1."""
        for name, proc in list(run.procs.items()):
            if self.runtime is None:
                _signal(proc, sig)
            elif proc.returncode is None:
                self.runtime.signal(run.containers[name], sig)

    # --- the sync loop ----------------------------------------------------------------------------
    def sync(self) -> None:
        mine = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self.store.list("Pod")
                if p["spec"].get("nodeName") == self.node}
        for key, pod in mine.items():
            run = self.pods.get(key)
            if run is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                run = Running(key, pod["metadata"]["uid"], self.root / "pods" / f"{key[0]}_{key[1]}_{pod['metadata']['uid']}")
                self.pods[key] = run
                run.task = asyncio.get_running_loop().create_task(self._run_pod(run))
            if run is None or run.uid != pod["metadata"]["uid"]:
                continue
            if pod["metadata"].get("deletionTimestamp") and not run.killing:
                run.killing = True
                asyncio.get_running_loop().create_task(self._terminate(run, pod["metadata"].get("deletionGracePeriodSeconds", 0)))
            deadline = pod["spec"].get("activeDeadlineSeconds")
            if deadline and not run.killing and time.monotonic() - run.started > deadline:
                run.killing = True
                asyncio.get_running_loop().create_task(self._deadline(run))
        for key, run in list(self.pods.items()):
            if key not in mine or mine[key]["metadata"]["uid"] != run.uid:  # force-deleted: kill now
                if not run.killing or self.runtime is None:
                    run.killing = True
                    self._signal(run, signal.SIGKILL)
                if run.task is None or run.task.done():
                    self.pods.pop(key, None)

    async def _terminate(self, run: Running, grace: int) -> None:
        self._signal(run, signal.SIGTERM)
        end = time.monotonic() + grace
        while any(p.returncode is None for p in run.procs.values()) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        self._signal(run, signal.SIGKILL)
        if run.task:
            await asyncio.wait([run.task])
        ns, name = run.pod_key
        pod = self.store.find("Pod", ns, name)
        if pod is not None and pod["metadata"]["uid"] == run.uid:
            self.store.delete("Pod", ns, name, 0)
        self.pods.pop(run.pod_key, None)

    async def _deadline(self, run: Running) -> None:
        self._signal(run, signal.SIGKILL)
        if run.task:
            await asyncio.wait([run.task])
        self._update(run, lambda st: st.update(phase="Failed", reason="DeadlineExceeded",
                                               message="Pod was active on the node longer than the specified deadline"))

    # --- one pod ----------------------------------------------------------------------------------
    def _update(self, run: Running, change) -> None:
        pod = self.store.find("Pod", *run.pod_key)
        if pod is None or pod["metadata"]["uid"] != run.uid:
            return
        change(pod.setdefault("status", {}))
        self.store.replace(pod)

    def _set_container(self, run: Running, name: str, state: dict, **extra) -> None:
        def change(st: dict) -> None:
            statuses = {c["name"]: c for c in st.get("containerStatuses", [])}
            old = statuses.get(name, {"name": name, "restartCount": 0, "image": "", "imageID": "", "ready": False})
            statuses[name] = {**old, "state": state, "ready": "running" in state, "started": "running" in state, **extra}
            st["containerStatuses"] = list(statuses.values())
        self._update(run, change)

    async def _run_pod(self, run: Running) -> None:
        ns, name = run.pod_key
        pod = self.store.get("Pod", ns, name)
        hostname = pod["spec"].get("hostname") or name[:63]
        containers = pod["spec"]["containers"]
        try:
            if self.runtime is not None:  # the pod's sandbox first: its address is the pod's
                run.sandbox = self.runtime.sandbox_name(ns, name, run.uid)
                try:
                    run.ip = await asyncio.to_thread(self.runtime.start_sandbox, run.sandbox, hostname)
                except Exception as e:  # noqa: BLE001 - the runtime's message goes to the pod, as the kubelet's event
                    message = str(e)
                    self._update(run, lambda st: st.update(phase="Failed", reason="FailedCreatePodSandBox", message=message))
                    return
            self._update(run, lambda st: st.update(
                phase="Pending", hostIP=self.node_ip, podIP=run.ip, podIPs=[{"ip": run.ip}], startTime=now(),
                conditions=_conditions(st, Initialized="True", Ready="False", ContainersReady="False")))
            for c in containers:
                self._set_container(run, c["name"], {"waiting": {"reason": "ContainerCreating"}})
            results = await asyncio.gather(*(self._run_container(run, c, hostname) for c in containers))
        finally:
            if run.sandbox is not None:  # the containers are gone: the address goes back to the pool
                await asyncio.to_thread(self.runtime.remove_sandbox, run.sandbox)
        if run.killing and self.store.find("Pod", ns, name) is None:
            return
        phase = "Succeeded" if all(code == 0 for code in results) else "Failed"
        self._update(run, lambda st: st.update(phase=st.get("phase") if st.get("reason") == "DeadlineExceeded" else phase,
                                               conditions=_conditions(st, Ready="False", ContainersReady="False")))

    async def _run_container(self, run: Running, c: dict, hostname: str) -> int:
        ns, name = run.pod_key
        restarts = 0
        while True:
            pod = self.store.find("Pod", ns, name)
            if pod is None or run.killing:
                return 137
            try:
                env = self._env(pod, c)
                if self.runtime is not None:
                    argv, cwd = self._container(pod, c, run, env, restarts), None
                else:
                    image = self._image(c)
                    argv = self._sandbox(pod, c, run, hostname)
                    cwd = c.get("workingDir") or image.workdir
            except ConfigError as e:
                reason = "ErrImagePull" if isinstance(e, ImageError) else "CreateContainerConfigError"
                self._set_container(run, c["name"], {"waiting": {"reason": reason, "message": str(e)}})
                await asyncio.sleep(0.5)
                continue
            command = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
            if self.runtime is None and not command:
                self._set_container(run, c["name"], {"waiting": {"reason": "CreateContainerConfigError",
                                                                 "message": "no command (images are not run here)"}})
                return 1
            log = run.dir / c["name"] / "0.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            if self.runtime is None:
                argv, proc_env = [*argv, "--chdir", cwd, "--", *command], env
            else:
                from tests.k8s_standin.podman import podman_env
                proc_env = podman_env()
            with log.open("ab") as out:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env=proc_env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
            run.procs[c["name"]] = proc
            if run.killing:  # deleted while it was starting: the terminator may have signalled already
                self._signal(run, signal.SIGKILL)
            started = now()
            self._set_container(run, c["name"], {"running": {"startedAt": started}}, restartCount=restarts)
            self._update(run, lambda st: st.update(phase="Running", conditions=_conditions(st, Ready="True", ContainersReady="True")))
            rc = await proc.wait()
            code = rc if rc >= 0 else 128 - rc
            if self.runtime is not None:  # podman's own exit code is the container's, unless podman failed
                code = await asyncio.to_thread(self.runtime.exit_code, run.containers[c["name"]], code)
            term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": started,
                    "finishedAt": now(), "containerID": f"standin://{proc.pid}"}
            if code and c.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                term["message"] = log.read_bytes()[-2048:].decode("utf-8", "replace")
            policy = pod["spec"].get("restartPolicy", "Always")
            again = not run.killing and (policy == "Always" or (policy == "OnFailure" and code != 0))
            if not again:
                self._set_container(run, c["name"], {"terminated": term}, restartCount=restarts)
                return code
            restarts += 1
            self._set_container(run, c["name"], {"waiting": {"reason": "CrashLoopBackOff"}},
                                lastState={"terminated": term}, restartCount=restarts)
            await asyncio.sleep(min(10.0, 0.5 * 2 ** restarts))  # the kubelet's back-off, shortened

    # --- container setup --------------------------------------------------------------------------
    def _image(self, c: dict) -> Image:
        image = self.images.get(c.get("image", ""))
        if image is None:
            raise ImageError(f'Back-off pulling image "{c.get("image")}": the stand-in node knows the images '
                              f"{sorted(self.images)}")
        return image

    def _env(self, pod: dict, c: dict) -> dict[str, str]:
        # a real image's own ENV is under the container's (the runtime merges them); $(VAR) never sees it
        base = {} if self.runtime is not None else {**self.base_env, **self._image(c).env}
        return resolve_env(self.store, pod, c, base)

    def _source(self, kind: str, ns: str, name: str, optional: bool) -> dict[str, str] | None:
        return podenv.source(self.store, kind, ns, name, optional)

    def _sandbox(self, pod: dict, c: dict, run: Running, hostname: str | None = None) -> list[str]:
        """The bwrap line: this machine's root, the pod's volumes and hosts file, own PID/UTS ns."""
        hostname = hostname or pod["spec"].get("hostname") or pod["metadata"]["name"][:63]
        argv = ["bwrap", "--die-with-parent", "--unshare-pid", "--as-pid-1", "--unshare-uts", "--hostname", hostname,
                "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
        for entry in sorted(os.listdir("/")):
            path = Path("/") / entry
            if entry in ("dev", "proc") or not (path.is_dir() or path.is_symlink()):
                continue
            argv += ["--symlink", os.readlink(path), str(path)] if path.is_symlink() else ["--dev-bind", str(path), str(path)]
        binds = self._image(c).binds
        for target, source in binds.items():
            argv += ["--bind", source, target]
        mounts = self._mounts(pod, c, run)
        for source, target, ro in mounts:
            argv += ["--ro-bind" if ro else "--bind", source, target]
        # An image's files also keep the paths they were built at, as in a real image: a venv's scripts
        # name their interpreter by that path. A volume over one of them (the pods' /tmp emptyDir over a
        # checkout under /tmp) must not hide it, or `accelerate` fails with "No such file or directory".
        # Read-only: what a pod does to its volume (a sandbox pod empties its /tmp between runs) must
        # never reach this machine's checkout through it (seen: a read-write bind here lost the checkout).
        for source in binds.values():
            if any(Path(source).is_relative_to(target) for _, target, _ in mounts):
                argv += ["--ro-bind", source, source]
        argv += ["--ro-bind", str(self.hosts_file), "/etc/hosts"]
        return argv

    def _mounts(self, pod: dict, c: dict, run: Running, tmpfs: list | None = None) -> list[tuple[str, str, bool]]:
        """(path on this machine, mount path, read-only) of the container's volumeMounts; ``medium: Memory``
        emptyDirs go to ``tmpfs`` as (mount path, sizeLimit) instead when a list is given."""
        vols, out = {v["name"]: v for v in pod["spec"].get("volumes") or []}, []
        for mount in c.get("volumeMounts") or []:
            vol = vols.get(mount["name"])
            if tmpfs is not None and vol and (vol.get("emptyDir") or {}).get("medium") == "Memory":
                tmpfs.append((mount["mountPath"], vol["emptyDir"].get("sizeLimit")))
                continue
            out.append((str(self._volume(pod, run, vol, mount["name"])), mount["mountPath"], bool(mount.get("readOnly"))))
        return out

    def _container(self, pod: dict, c: dict, run: Running, env: dict[str, str], attempt: int) -> list[str]:
        """The runtime's line for this container (security context, limits, env file, volumes, command)."""
        from tests.k8s_standin.podman import write_env_file

        if self.runtime.image_user(c.get("image", "")) is None:
            raise ImageError(f'Back-off pulling image "{c.get("image")}": not on the node (the stand-in pulls nothing)')
        name = run.containers[c["name"]] = f"{run.sandbox}-{c['name']}-{attempt}"
        tmpfs: list = []
        mounts = self._mounts(pod, c, run, tmpfs)
        try:
            write_env_file(run.dir / c["name"] / "env", env)
            return self.runtime.run_argv(
                run.sandbox, name, c, pod, run.dir / c["name"] / "env", mounts, tmpfs,
                [expand(a, env) for a in c.get("command") or []], [expand(a, env) for a in c.get("args") or []],
                self.hosts_file)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def _volume(self, pod: dict, run: Running, vol: dict | None, name: str) -> Path:
        path = run.dir / "volumes" / name
        if vol is None:
            raise ConfigError(f"volumeMount {name!r} names no volume of the pod")
        if "emptyDir" in vol:
            path.mkdir(parents=True, exist_ok=True)
            if self.runtime is not None:
                path.chmod(0o777)  # as the kubelet makes an emptyDir: any user of the pod may write
            return path
        for kind, key in (("Secret", "secret"), ("ConfigMap", "configMap")):
            if key in vol:
                src = vol[key]
                data = self._source(kind, pod["metadata"]["namespace"], src.get("secretName") or src.get("name"),
                                    bool(src.get("optional"))) or {}
                if path.exists():
                    shutil.rmtree(path)
                path.mkdir(parents=True)
                for k, v in data.items():
                    (path / k).write_text(v)
                return path
        raise ConfigError(f"volume {name!r}: only emptyDir, configMap and secret volumes are supported by the stand-in")


def _conditions(st: dict, **values: str) -> list[dict]:
    conds = {c["type"]: c for c in st.get("conditions", [])}
    for type_, status in values.items():
        if conds.get(type_, {}).get("status") != status:
            conds[type_] = {"type": type_, "status": status, "lastTransitionTime": now()}
    return list(conds.values())


def container_pid(proc: asyncio.subprocess.Process) -> int | None:
    """The host pid of the container's PID 1 (the command): bwrap's only child."""
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    """To the container's PID 1, as a runtime does (SIGKILL of PID 1 ends the whole PID namespace).

    PID 1 ignores signals it has no handler for, in a container as here: a program that does not
    handle SIGTERM runs on until the grace period ends in SIGKILL.
    """
    if proc.returncode is not None:
        return
    pid = container_pid(proc)
    try:
        if pid is None or sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)  # bwrap and everything still in its process group
        if pid is not None:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass
