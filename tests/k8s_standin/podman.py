"""The node's container runtime when pods run as real containers: podman (runc) on its bridge network.

What the kubelet asks of it, as a kubelet asks a CRI runtime:

- a pod sandbox per pod: a podman pod whose infra (pause) container holds the pod's own network
  namespace on the ``podman`` bridge (netavark; addresses 10.88.0.x) and its hostname; its address
  is the pod's ``status.podIP``, known before any container starts (the downward API can use it);
- each container in that sandbox, from the image the pod names (never pulled: ``--pull never``, a
  missing image is ``ErrImagePull``), with the pod's ``securityContext`` applied (``runAsUser``/
  ``runAsGroup``, ``runAsNonRoot`` checked against the user the image runs as,
  ``readOnlyRootFilesystem``, ``capabilities.drop``, ``allowPrivilegeEscalation: false`` as
  no-new-privileges, seccomp ``RuntimeDefault`` = podman's default profile), CPU and memory limits
  as cgroup limits, ``command``/``args`` over the image's entrypoint/cmd, the resolved environment
  (an env file, not argv), the pod's volumes as bind mounts (``emptyDir`` with ``medium: Memory`` a
  tmpfs of its ``sizeLimit``) and the stand-in's ``/etc/hosts`` (``controllers.Dns`` maps pod
  hostnames and headless-Service names to pod addresses);
- signals to the container's PID 1 (``podman kill``), the exit code (``podman inspect``), exec into a
  running container, and removing a pod's sandbox (its address goes back to the pool).

The node itself: its address is the bridge's gateway (10.88.0.1), where the API server and the
test's servers (S3, MLflow) listen so that pods reach them. netavark deletes the bridge, gateway
address and all, when its last container stops, so the runtime keeps one pod of its own (the
node's) running for as long as the cluster lives.

Everything this runtime makes carries the label ``temper.standin=<cluster id>``; ``cleanup`` removes
exactly that, never other users' containers. Not imitated: OOMKilled (podman 4.3 with runc on this
machine's cgroup v1 reports a memory-limit kill as exit 137 without the flag), image pulls, probes.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

from kubernetes.utils import parse_quantity

LABEL = "temper.standin"


class PodmanError(Exception):
    """The runtime could not do what was asked (podman's own message)."""


def podman_env() -> dict[str, str]:
    """podman's environment: this machine's (PATH for runc/conmon) and the containers.conf it needs here."""
    repo = Path(__file__).resolve().parents[2]
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(repo / "docker" / "containers.conf"))}


def podman(*args: str, check: bool = True, timeout: float = 120) -> str:
    out = subprocess.run(["podman", "--runtime", "runc", *args], capture_output=True, text=True, env=podman_env(),
                         timeout=timeout)
    if check and out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines() or [f"exit code {out.returncode}"]
        raise PodmanError(f"podman {args[0]}: {lines[-1]}")
    return out.stdout.strip()


def bridge_gateway(network: str = "podman") -> str:
    return podman("network", "inspect", network, "--format", "{{range .Subnets}}{{.Gateway}}{{end}}")


class PodmanRuntime:
    def __init__(self, network: str = "podman", shared_binds: dict[str, str] | None = None) -> None:
        self.network = network
        self.id = uuid.uuid4().hex[:8]
        self.shared_binds = dict(shared_binds or {})  # host path -> container path, in every container
        self.node_pod = f"standin-{self.id}-node"
        self._image_users: dict[str, str] = {}
        self.gateway = ""

    # --- the node -------------------------------------------------------------------------------
    def start(self) -> str:
        """Keep the bridge (and the gateway address the servers listen on) up; the node's address."""
        podman("pod", "create", "--name", self.node_pod, "--network", self.network, "--label", f"{LABEL}={self.id}")
        podman("pod", "start", self.node_pod)
        self.gateway = bridge_gateway(self.network)
        return self.gateway

    def cleanup(self) -> None:
        """Remove every pod sandbox (and its containers) of this cluster, the node's last."""
        names = podman("pod", "ps", "--filter", f"label={LABEL}={self.id}", "--format", "{{.Name}}", check=False).split()
        for name in sorted(names, key=lambda n: n == self.node_pod):
            podman("pod", "rm", "-f", "-t", "0", name, check=False)

    # --- pod sandboxes --------------------------------------------------------------------------
    def sandbox_name(self, ns: str, name: str, uid: str) -> str:
        return f"standin-{self.id}-{ns}-{name}-{uid[:8]}"

    def start_sandbox(self, sandbox: str, hostname: str) -> str:
        """The pod's network namespace and hostname (its infra container); returns the pod's address."""
        podman("pod", "create", "--name", sandbox, "--hostname", hostname, "--network", self.network,
               "--label", f"{LABEL}={self.id}")
        podman("pod", "start", sandbox)
        infra = podman("pod", "inspect", sandbox, "--format", "{{.InfraContainerID}}")
        return podman("inspect", infra, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")

    def remove_sandbox(self, sandbox: str) -> None:
        podman("pod", "rm", "-f", "-t", "0", sandbox, check=False)

    # --- containers -----------------------------------------------------------------------------
    def image_user(self, image: str) -> str | None:
        """The user the image runs as (``USER``), or None when the image is not on this node."""
        if image not in self._image_users:
            out = subprocess.run(["podman", "--runtime", "runc", "image", "inspect", image, "--format", "{{.Config.User}}"],
                                 capture_output=True, text=True, env=podman_env())
            if out.returncode != 0:
                return None
            self._image_users[image] = out.stdout.strip()
        return self._image_users[image]

    def run_argv(self, sandbox: str, container: str, c: dict, pod: dict, env_file: Path,
                 mounts: list[tuple[str, str, bool]], tmpfs: list[tuple[str, str | None]], command: list[str],
                 args: list[str], hosts_file: Path) -> list[str]:
        """``podman run`` (attached: its output is the container's) for one container of the pod.

        Raises ValueError with the kubelet's message when the security context cannot be met.
        """
        sec = {**(pod["spec"].get("securityContext") or {}), **(c.get("securityContext") or {})}
        user = self.image_user(c["image"]) or ""
        uid = sec.get("runAsUser", user.split(":")[0] if user else "0")
        if sec.get("runAsNonRoot") and str(uid) in ("", "0", "root"):
            raise ValueError("container has runAsNonRoot and image will run as root")
        if sec.get("runAsNonRoot") and not str(uid).isdigit():
            raise ValueError(f"container has runAsNonRoot and image has non-numeric user ({uid}), cannot verify user is non-root")
        argv = ["podman", "--runtime", "runc", "run", "--name", container, "--pod", sandbox, "--pull", "never",
                "--sig-proxy=false", "--label", f"{LABEL}={self.id}", "--env-file", str(env_file),
                "-v", f"{hosts_file}:/etc/hosts:ro"]
        if "runAsUser" in sec or "runAsGroup" in sec:
            gid = sec.get("runAsGroup", user.split(":")[1] if ":" in user else uid)
            argv += ["--user", f"{uid}:{gid}"]
        if sec.get("fsGroup") is not None:
            argv += ["--group-add", str(sec["fsGroup"])]
        if sec.get("readOnlyRootFilesystem"):
            argv += ["--read-only", "--read-only-tmpfs=false"]  # only the pod's volumes are writable
        drop = (sec.get("capabilities") or {}).get("drop") or []
        argv += [a for cap in drop for a in ("--cap-drop", cap)]
        argv += [a for cap in (sec.get("capabilities") or {}).get("add") or [] for a in ("--cap-add", cap)]
        if sec.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        if (sec.get("seccompProfile") or {}).get("type") == "Unconfined":
            argv += ["--security-opt", "seccomp=unconfined"]
        limits = (c.get("resources") or {}).get("limits") or {}
        if "cpu" in limits:
            argv += ["--cpus", f"{float(parse_quantity(limits['cpu'])):g}"]
        if "memory" in limits:
            argv += ["--memory", str(int(parse_quantity(limits["memory"])))]
        for source, target, ro in mounts:
            argv += ["-v", f"{source}:{target}:{'ro' if ro else 'rw'}"]
        for source, target in self.shared_binds.items():
            argv += ["-v", f"{source}:{target}:rw"]
        for target, size in tmpfs:
            argv += ["--mount", f"type=tmpfs,destination={target},tmpfs-mode=1777"
                     + (f",tmpfs-size={int(parse_quantity(size))}" if size else "")]
        if c.get("workingDir"):
            argv += ["--workdir", c["workingDir"]]
        if command:
            argv += ["--entrypoint", json.dumps(command)]
        return argv + [c["image"], *args]

    def exit_code(self, container: str, fallback: int) -> int:
        out = podman("inspect", container, "--format", "{{.State.ExitCode}}", check=False)
        return int(out) if out.lstrip("-").isdigit() else fallback

    def signal(self, container: str, sig: int) -> None:
        """To the container's PID 1, as the kubelet's runtime sends it."""
        podman("kill", "--signal", str(sig), container, check=False, timeout=30)

    def exec_argv(self, container: str, command: list[str], workdir: str | None) -> list[str]:
        return ["podman", "--runtime", "runc", "exec", "-i", *(["--workdir", workdir] if workdir else []),
                container, *command]


def write_env_file(path: Path, env: dict[str, str]) -> None:
    """The container's environment as podman's ``--env-file`` (one ``KEY=value`` a line), readable by root only."""
    bad = [k for k, v in env.items() if "\n" in v]
    if bad:
        raise ValueError(f"env {bad[0]}: a value with a newline is not supported by the stand-in's container runtime")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in env.items())
