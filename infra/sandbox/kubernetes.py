"""Kubernetes backend of the sandbox API: one box is one restricted sandbox pod.

``create_box`` creates the pod ``infra.k8s.manifests.sandbox_pod`` builds (Pod Security
"restricted", read-only root, no service-account token, deny-all NetworkPolicy by label,
optional gVisor/Kata runtime class, killed by the cluster at ``sandbox_lifetime_s``), waits
until its container runs, and hands it out. Every box operation is one exec of the in-pod
executor (``infra.k8s.sandbox_exec``), which enforces the run's limits next to the program and
reports how it ended; this module frames the request, parses the report into a ``Result`` with
the same verdict rules as the local backend (``infra.sandbox.process.classify``), and deletes the
pod on ``close`` or when creating it fails half-way.

All API calls go through the thin ``infra.k8s.api.ClusterApi`` (create, read_pod, exec, delete):
what is here is plain logic, tested against a fake of that layer.

Differences from the bwrap backend, by construction: the whole pod is the sandbox, so files are
written and read by the sandbox uid itself (a planted symlink can only point inside the pod);
/tmp is emptied before each run rather than being a fresh tmpfs; ``Limits.tmp_mb`` and
``Limits.disk_mb`` are not applied (the pod's emptyDirs are ``sandbox_scratch`` each, and the
pod's memory limit is the box-wide memory budget); RLIMIT_NPROC only applies where the
pod has its own user namespace (the node's pids limit caps a fork bomb otherwise).
"""

from __future__ import annotations

import io
import json
import logging
import secrets
import tarfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

from infra.k8s import manifests as m
from infra.k8s import sandbox_exec
from infra.k8s.errors import KubernetesError
from infra.k8s.outcomes import FAIL_FAST_WAITING
from infra.k8s.options import KubernetesOptions
from infra.sandbox import snapshot as snapshot_module
from infra.sandbox.api import Limits, Outcome, Profile, Result, SandboxError, StateLimitError, safe_relpath
from infra.sandbox.bwrap import BASE_ENV
from infra.sandbox.process import classify
from infra.sandbox.snapshot import StateLimits

log = logging.getLogger(__name__)



def executor_source() -> str:
    """What each exec runs: ``infra.sandbox.snapshot``'s source, then ``sandbox_exec``'s (both stdlib
    only; the pod need not have temper), with their ``from __future__`` line once, at the top."""
    future = "from __future__ import annotations\n"
    parts = [Path(module.__file__).read_text() for module in (snapshot_module, sandbox_exec)]
    if not all(future in part for part in parts):
        raise RuntimeError(f"the executor's modules must each start with {future.strip()!r}")
    return future + "\n".join(part.replace(future, "", 1) for part in parts)


EXECUTOR_SOURCE = executor_source()
EXEC_ERRORS = (ApiException, KubernetesError)  # what ClusterApi.exec raises when the exec itself fails
OOM_FILES = ["/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"]
HEALTH_MARGIN_S = 60.0  # a box this close to its pod's deadline is not handed out again


class SandboxApi(Protocol):
    """The part of ``infra.k8s.api.ClusterApi`` a sandbox needs."""

    def create(self, obj: Any) -> Any: ...
    def read_pod(self, namespace: str, name: str) -> k.V1Pod: ...
    def delete(self, kind: str, namespace: str, name: str) -> None: ...
    def exec(self, namespace: str, pod: str, container: str, argv: list[str], stdin: bytes | None,
             timeout_s: float) -> tuple[int | None, bytes, bytes]: ...


@dataclass(frozen=True)
class PodLayout:
    """Where things are inside the sandbox pod; the defaults are what ``sandbox_pod`` mounts."""

    work_dir: str = m.SANDBOX_WORK
    tmp_dir: str = m.SANDBOX_TMP
    python: str = "python3"
    oom_files: tuple[str, ...] = tuple(OOM_FILES)


@dataclass
class ExecReport:
    """One executor exec: its stdout, the program's stderr, and the trailer (None if it never came)."""

    stdout: bytes
    stderr: bytes
    trailer: dict | None
    exit_code: int | None  # of the executor process itself (None: the exec timed out)


def frame(op: str, nonce: str, layout: PodLayout, payload: bytes = b"", **fields: Any) -> bytes:
    """The executor's stdin: length-prefixed JSON request, then the payload."""
    req = {"op": op, "nonce": nonce, "work_dir": layout.work_dir, "tmp_dir": layout.tmp_dir,
           "oom_files": list(layout.oom_files), "payload_len": len(payload), **fields}
    body = json.dumps(req).encode()
    return str(len(body)).encode() + b"\n" + body + payload


def split_trailer(stderr: bytes, nonce: str) -> tuple[bytes, dict | None]:
    """(the program's own stderr, the executor's trailer); the last nonce line wins."""
    marker = b"\n" + nonce.encode() + b" "
    at = stderr.rfind(marker)
    if at < 0:
        return stderr, None
    try:
        trailer = json.loads(stderr[at + len(marker):].strip())
    except ValueError:
        return stderr, None
    return stderr[:at], trailer if isinstance(trailer, dict) else None


def result_from(report: ExecReport) -> Result:
    """Executor trailer -> Result, verdicts as the local backend gives them."""
    t = report.trailer or {}
    verdict: Outcome = ("timeout" if t.get("timed_out") else "output_limit" if t.get("output_exceeded")
                        else "memory" if t.get("oom_kills") else "ok")
    result = Result(
        stdout=report.stdout.decode(errors="replace"), stderr=report.stderr.decode(errors="replace"),
        exit_code=t.get("exit_code"), signal=t.get("signal"), verdict=verdict,
        wall_s=float(t.get("wall_s", 0.0)), cpu_s=float(t.get("cpu_s", 0.0)),
        max_rss_mb=float(t.get("max_rss_mb", 0.0)), truncated=bool(t.get("truncated")),
    )
    return classify(result, report.stderr)


def files_tar(files: Mapping[str, str | bytes]) -> bytes:
    """Regular files only, names checked here: the executor extracts them into the work dir."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else bytes(content)
            info = tarfile.TarInfo(safe_relpath(name))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _main_status(pod: k.V1Pod) -> k.V1ContainerStatus | None:
    for cs in (pod.status.container_statuses if pod.status else None) or []:
        if cs.name == m.MAIN_CONTAINER:
            return cs
    return None


def pod_state(pod: k.V1Pod) -> tuple[str, str]:
    """('running' | 'pending' | 'failed', why): the start wait's view of one pod status."""
    st = pod.status or k.V1PodStatus()
    cs = _main_status(pod)
    state = (cs.state if cs is not None else None) or k.V1ContainerState()
    if st.phase == "Running" and state.running:
        return "running", ""
    if st.phase in ("Failed", "Succeeded"):
        term = state.terminated or k.V1ContainerStateTerminated(exit_code=0)
        return "failed", f"{st.reason or term.reason or st.phase}: {st.message or term.message or 'the pod ended'}"
    if state.waiting and state.waiting.reason in FAIL_FAST_WAITING:
        return "failed", f"{FAIL_FAST_WAITING[state.waiting.reason]}: {state.waiting.message or state.waiting.reason}"
    for c in st.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            return "pending", f"{c.reason}: {c.message or ''}".rstrip(": ")
    return "pending", (state.waiting.reason if state.waiting else None) or st.phase or "no status yet"


@dataclass
class KubernetesBackend:
    """Makes sandbox pods in ``opts.sandbox_ns``. ``api`` is a ``ClusterApi`` (after ``load_config``)."""

    api: SandboxApi
    opts: KubernetesOptions = field(default_factory=KubernetesOptions)
    layout: PodLayout = field(default_factory=PodLayout)
    image: str | None = None
    poll_s: float = 0.5
    exec_grace_s: float = 30.0  # API round trip on top of a run's own wall limit
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    name: str = "kubernetes"
    owner: str | None = None  # the job this process runs in (its settings' job.sandbox_owner): labels every box

    def create_box(self, profile: Profile) -> "KubernetesBox":
        pod_name = f"sandbox-{uuid.uuid4().hex[:12]}"
        pod = m.sandbox_pod(pod_name, self.opts, self.opts.sandbox_lifetime_s, image=self.image, owner=self.owner)
        ns = self.opts.sandbox_ns
        try:
            self.api.create(pod)
        except ApiException as e:
            hint = " (RBAC: the temper-flow-runner Role grants pods create)" if e.status == 403 else ""
            raise SandboxError(f"cannot create sandbox pod {ns}/{pod_name}: {e.status} {e.reason}{hint}") from e
        try:
            self._wait_running(pod_name)
        except BaseException:
            self._delete(pod_name)
            raise
        return KubernetesBox(self, profile, pod_name, started=self.clock())

    def _wait_running(self, pod_name: str) -> None:
        ns, deadline = self.opts.sandbox_ns, self.clock() + self.opts.sandbox_start_timeout_s
        while True:
            try:
                state, why = pod_state(self.api.read_pod(ns, pod_name))
            except ApiException as e:
                raise SandboxError(f"sandbox pod {ns}/{pod_name}: cannot read its status: {e.status} {e.reason}") from e
            if state == "running":
                return
            if state == "failed":
                raise SandboxError(f"sandbox pod {ns}/{pod_name} did not start: {why}")
            if self.clock() >= deadline:
                raise SandboxError(f"sandbox pod {ns}/{pod_name} not running after "
                                   f"{self.opts.sandbox_start_timeout_s:.0f}s ({why}); check sandbox_cpu/"
                                   "sandbox_memory against the quota, the runtime class and the image")
            self.sleep(self.poll_s)

    def _delete(self, pod_name: str) -> None:
        """Best effort: a pod that cannot be deleted now still dies at its activeDeadlineSeconds."""
        try:
            self.api.delete("Pod", self.opts.sandbox_ns, pod_name)
        except EXEC_ERRORS as e:  # said, not swallowed: a pod outliving its job must leave a trace in the job's log
            log.warning("sandbox pod %s/%s: delete failed (%s); it ends at its deadline", self.opts.sandbox_ns, pod_name,
                        " ".join(str(e).split())[:200])


class KubernetesBox:
    """One sandbox pod; each method is one exec of the executor. One caller at a time."""

    def __init__(self, backend: KubernetesBackend, profile: Profile, pod: str, started: float) -> None:
        self.backend, self.profile, self.pod, self.started = backend, profile, pod, started
        self.id = pod
        self.closed = False
        self.broken = ""  # why the box may not be reused (the pool then replaces it)

    # --- one exec ---------------------------------------------------------------------------
    def _exec(self, op: str, timeout_s: float, payload: bytes = b"", **fields: Any) -> ExecReport:
        if self.closed:
            raise SandboxError(f"box {self.id} is closed")
        b = self.backend
        nonce = secrets.token_hex(16)
        argv = [b.layout.python, "-I", "-c", EXECUTOR_SOURCE]
        code, out, err = b.api.exec(b.opts.sandbox_ns, self.pod, m.MAIN_CONTAINER, argv,
                                    frame(op, nonce, b.layout, payload, **fields), timeout_s)
        program_err, trailer = split_trailer(err, nonce)
        return ExecReport(out, program_err, trailer, code)

    def _op(self, op: str, payload: bytes = b"", **fields: Any) -> bytes:
        """A file operation: its data, or SandboxError with the executor's reason."""
        try:
            report = self._exec(op, self.backend.exec_grace_s, payload, **fields)
        except EXEC_ERRORS as e:
            self.broken = f"exec failed: {e}"
            raise SandboxError(f"box {self.id}: {op} failed: {e}") from e
        if report.trailer is None:
            self.broken = f"{op}: no report from the executor"
            raise SandboxError(f"box {self.id}: {op} got no report from the executor "
                               f"(exit {report.exit_code}): {report.stderr[-300:].decode(errors='replace')}")
        if report.trailer.get("state_limit"):
            raise StateLimitError(f"box {self.id}: work dir over its snapshot limits: {report.trailer['error']}")
        if report.trailer.get("error"):
            what = f"{op} {fields['path']!r}" if "path" in fields else op
            raise SandboxError(f"box {self.id}: {what}: {report.trailer['error']}")
        return report.stdout

    # --- Box protocol -----------------------------------------------------------------------
    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        if files:
            self._op("write", files_tar(files))

    def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes:
        return self._op("read", path=safe_relpath(path), max_bytes=int(max_bytes))

    def run(self, argv: list[str], limits: Limits, stdin: bytes | None = None,
            env: Mapping[str, str] | None = None) -> Result:
        if not argv:
            raise SandboxError("command is an empty argv")
        try:
            report = self._exec("run", limits.wall_s + self.backend.exec_grace_s, stdin or b"",
                                argv=list(argv), limits=limits.model_dump(), env={**BASE_ENV, **(env or {})})
        except EXEC_ERRORS as e:
            self.broken = f"exec failed: {e}"
            return Result(verdict="error", stderr=f"sandbox exec into pod {self.pod} failed: {e}")
        if report.trailer is not None:
            return result_from(report)
        return self._lost(report)

    def _lost(self, report: ExecReport) -> Result:
        """No report: the executor died with its container (OOM kill of the pod) or the exec hung."""
        verdict: Outcome = "error"
        why = "the exec timed out" if report.exit_code is None else f"the executor exited {report.exit_code}"
        try:
            cs = _main_status(self.backend.api.read_pod(self.backend.opts.sandbox_ns, self.pod))
        except ApiException:
            cs = None
        term = cs and ((cs.state and cs.state.terminated) or (cs.last_state and cs.last_state.terminated))
        if term and term.reason == "OOMKilled":
            verdict, why = "memory", f"the sandbox container was OOM-killed (limit {self.backend.opts.sandbox_memory})"
        elif term:
            why += f"; the sandbox container ended ({term.reason}, exit {term.exit_code})"
        self.broken = why
        return Result(stdout=report.stdout.decode(errors="replace"),
                      stderr=report.stderr.decode(errors="replace") + f"\nsandbox: {why}", verdict=verdict)

    def snapshot(self, limits: StateLimits | None = None) -> bytes:
        return self._op("snapshot", limits=asdict(limits or StateLimits()))

    def restore(self, archive: bytes) -> None:
        self._op("restore", archive)

    def reset(self) -> None:
        self._op("reset")

    def healthy(self) -> bool:
        b = self.backend
        if self.closed or self.broken:
            return False
        if b.clock() - self.started > b.opts.sandbox_lifetime_s - HEALTH_MARGIN_S:
            return False  # the cluster kills the pod soon: let the pool replace it now
        try:
            state, _ = pod_state(b.api.read_pod(b.opts.sandbox_ns, self.pod))
        except ApiException:
            return False
        return state == "running"

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.backend._delete(self.pod)
