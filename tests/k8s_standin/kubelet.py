"""The node agent: runs the pods bound to its node as local processes and reports on them.

What it does as the kubelet does:

- for each pod bound to its node: resolves every container's environment in Kubernetes order
  (``envFrom`` Secrets/ConfigMaps, then ``env`` with ``$(VAR)`` expansion over earlier values,
  ``valueFrom`` ``fieldRef`` downward-API fields: ``metadata.name``, ``metadata.namespace``,
  ``metadata.uid``, ``metadata.labels['k']``, ``metadata.annotations['k']``, ``spec.nodeName``,
  ``spec.serviceAccountName``, ``status.podIP``, ``status.hostIP``; ``secretKeyRef`` and
  ``configMapKeyRef``), expands ``$(VAR)`` in ``command``/``args``, and starts them;
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

Containers: images are not pulled or unpacked. An ``Image`` names what the image would provide
(environment such as PATH, a working dir, and directories it would contain, bound from this
machine). Each container is a ``bwrap`` process tree with its own PID and UTS namespaces
(hostname = the pod's ``hostname`` or name), a root made of this machine's directories, the
pod's ``emptyDir``/``configMap``/``secret`` volumes bound at their mount paths, and an
``/etc/hosts`` the stand-in keeps (``dns.py``): the pods' and headless Services' names resolve
to 127.0.0.1, because every pod shares this machine's network namespace (like
``hostNetwork: true``; creating per-pod network namespaces with addresses needs root + veth).

Cut, and said where it matters: no cgroups, so resource limits are not enforced (no OOMKilled);
``securityContext`` (runAsUser, read-only root, capabilities, seccomp) is not applied; ``emptyDir`` with
``medium: Memory`` is a directory on disk; no probes, init containers or sidecars; volumes
other than emptyDir/configMap/secret fail the pod with CreateContainerConfigError; a deleted pod's
emptyDirs and logs stay on the node's disk (under the cluster's root, for tests to inspect) where a
kubelet removes them.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.k8s_standin.store import ApiError, Store, now

POD_IP = "127.0.0.1"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass
class Image:
    """What an image would provide, since images are not run here."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    binds: dict[str, str] = field(default_factory=dict)  # path in the container -> path on this machine


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known vars are replaced, unknown left as is, ``$$`` -> ``$``."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


class ConfigError(Exception):
    """CreateContainerConfigError: the container cannot be set up (yet)."""


def _field(pod: dict, path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": status.get("podIP", POD_IP), "status.hostIP": status.get("hostIP", POD_IP)}
    if path not in simple:
        raise ConfigError(f"unsupported fieldRef {path!r}")
    return simple[path]


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


class Kubelet:
    def __init__(self, store: Store, node: str, root: Path, images: dict[str, Image], hosts_file: Path,
                 base_env: dict[str, str] | None = None) -> None:
        self.store, self.node, self.root, self.images, self.hosts_file = store, node, root, images, hosts_file
        self.base_env = base_env or {"PATH": "/usr/local/bin:/usr/bin:/bin"}
        self.pods: dict[tuple[str, str], Running] = {}

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
        env = self._env(pod, spec)
        run = self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])]
        argv, cwd = self._sandbox(pod, spec, run), spec.get("workingDir") or self._image(spec).workdir
        return argv + ["--chdir", cwd, "--", *command], env, "/"

    # --- fault injection --------------------------------------------------------------------------
    def kill(self, ns: str, name: str, sig: int = signal.SIGKILL) -> None:
        """A rank dies on its own (crash, OOM killer): the container's processes get ``sig``."""
        run = self.pods.get((ns, name))
        if run is None:
            raise ApiError(404, "NotFound", f'pod "{name}" is not running on node {self.node}')
        for proc in run.procs.values():
            _signal(proc, sig)

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
                for proc in run.procs.values():
                    _signal(proc, signal.SIGKILL)
                if run.task is None or run.task.done():
                    self.pods.pop(key, None)

    async def _terminate(self, run: Running, grace: int) -> None:
        for proc in run.procs.values():
            _signal(proc, signal.SIGTERM)
        end = time.monotonic() + grace
        while any(p.returncode is None for p in run.procs.values()) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        for proc in run.procs.values():
            _signal(proc, signal.SIGKILL)
        if run.task:
            await asyncio.wait([run.task])
        ns, name = run.pod_key
        pod = self.store.find("Pod", ns, name)
        if pod is not None and pod["metadata"]["uid"] == run.uid:
            self.store.delete("Pod", ns, name, 0)
        self.pods.pop(run.pod_key, None)

    async def _deadline(self, run: Running) -> None:
        for proc in run.procs.values():
            _signal(proc, signal.SIGKILL)
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
        self._update(run, lambda st: st.update(
            phase="Pending", hostIP=POD_IP, podIP=POD_IP, podIPs=[{"ip": POD_IP}], startTime=now(),
            conditions=_conditions(st, Initialized="True", Ready="False", ContainersReady="False")))
        containers = pod["spec"]["containers"]
        for c in containers:
            self._set_container(run, c["name"], {"waiting": {"reason": "ContainerCreating"}})
        results = await asyncio.gather(*(self._run_container(run, c, hostname) for c in containers))
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
                image = self._image(c)
                argv = self._sandbox(pod, c, run, hostname)
            except ConfigError as e:
                reason = "ErrImagePull" if "image" in str(e) else "CreateContainerConfigError"
                self._set_container(run, c["name"], {"waiting": {"reason": reason, "message": str(e)}})
                await asyncio.sleep(0.5)
                continue
            command = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
            if not command:
                self._set_container(run, c["name"], {"waiting": {"reason": "CreateContainerConfigError",
                                                                 "message": "no command (images are not run here)"}})
                return 1
            log = run.dir / c["name"] / "0.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as out:
                proc = await asyncio.create_subprocess_exec(
                    *argv, "--chdir", c.get("workingDir") or image.workdir, "--", *command, env=env,
                    stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
            run.procs[c["name"]] = proc
            if run.killing:  # deleted while it was starting: the terminator may have signalled already
                _signal(proc, signal.SIGKILL)
            started = now()
            self._set_container(run, c["name"], {"running": {"startedAt": started}}, restartCount=restarts)
            self._update(run, lambda st: st.update(phase="Running", conditions=_conditions(st, Ready="True", ContainersReady="True")))
            rc = await proc.wait()
            code = rc if rc >= 0 else 128 - rc
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
            raise ConfigError(f'Back-off pulling image "{c.get("image")}": the stand-in node knows the images '
                              f"{sorted(self.images)}")
        return image

    def _source(self, kind: str, ns: str, name: str, optional: bool) -> dict[str, str] | None:
        obj = self.store.find(kind, ns, name)
        if obj is None:
            if optional:
                return None
            raise ConfigError(f'{kind.lower()} "{name}" not found')
        data = dict(obj.get("data") or {})
        if kind == "Secret":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            data.update(obj.get("stringData") or {})
        return data

    def _env(self, pod: dict, c: dict) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        env = {**self.base_env, **self._image(c).env}
        for src in c.get("envFrom") or []:
            ref = src.get("secretRef") or src.get("configMapRef")
            kind = "Secret" if src.get("secretRef") else "ConfigMap"
            data = self._source(kind, ns, ref["name"], bool(ref.get("optional")))
            env.update({src.get("prefix", "") + k: v for k, v in (data or {}).items()})
        for var in c.get("env") or []:
            vf = var.get("valueFrom")
            if vf is None:
                env[var["name"]] = expand(var.get("value", ""), env)
            elif vf.get("fieldRef"):
                env[var["name"]] = _field(pod, vf["fieldRef"]["fieldPath"])
            elif vf.get("secretKeyRef") or vf.get("configMapKeyRef"):
                ref = vf.get("secretKeyRef") or vf.get("configMapKeyRef")
                kind = "Secret" if vf.get("secretKeyRef") else "ConfigMap"
                data = self._source(kind, ns, ref["name"], bool(ref.get("optional")))
                if data is not None and ref["key"] in data:
                    env[var["name"]] = data[ref["key"]]
                elif not ref.get("optional"):
                    raise ConfigError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
            else:
                raise ConfigError(f"env {var['name']}: valueFrom {sorted(vf)} is not supported by the stand-in")
        return env

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
        for target, source in self._image(c).binds.items():
            argv += ["--bind", source, target]
        vols = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        for mount in c.get("volumeMounts") or []:
            argv += ["--bind" if not mount.get("readOnly") else "--ro-bind",
                     str(self._volume(pod, run, vols.get(mount["name"]), mount["name"])), mount["mountPath"]]
        argv += ["--ro-bind", str(self.hosts_file), "/etc/hosts"]
        return argv

    def _volume(self, pod: dict, run: Running, vol: dict | None, name: str) -> Path:
        path = run.dir / "volumes" / name
        if vol is None:
            raise ConfigError(f"volumeMount {name!r} names no volume of the pod")
        if "emptyDir" in vol:
            path.mkdir(parents=True, exist_ok=True)
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
