"""The Kubernetes sandbox backend (infra/sandbox/kubernetes.py) over a fake of the thin API layer.

What is real: the pod the backend creates (checked against the API schema, strict), the start
wait's reading of realistic pod status documents, the executor (infra/k8s/sandbox_exec.py, sent
as the exec's argv and run as a real process with the exec's stdin), the request framing, the
trailer parsing and verdict mapping, the pool on top, and the cleanup on every error path.

What is fake, and only that: ``FakeClusterApi`` stands in for ``infra.k8s.api.ClusterApi``'s four
calls. Its exec runs the argv locally instead of in a container, so the pod's /work and /tmp
are directories under tmp_path (``PodLayout``), the cgroup's memory.events is a file the test
writes, and all boxes of one backend share those directories (tests use one box at a time).
"""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pytest
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException

import infra.sandbox as sandbox
from infra.k8s import manifests as m
from infra.k8s.errors import KubernetesError
from infra.k8s.options import KubernetesOptions
from infra.sandbox import Limits, SandboxError, SandboxPool, get_profile
from infra.sandbox.api import Backend, Box
from infra.sandbox.kubernetes import KubernetesBackend, PodLayout, frame, split_trailer
from tests.unit.test_k8s_failures import T0, container_status
from tests.unit.test_k8s_static import restricted_violations

OPTS = KubernetesOptions(runtime_class="gvisor", sandbox_lifetime_s=600, sandbox_start_timeout_s=60)
PY = get_profile("python")
FAST = Limits(wall_s=5, cpu_s=5, memory_mb=1024)

SCHEDULING = {"phase": "Pending", "qosClass": "Guaranteed", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": T0,
     "message": "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: "
                "3 No preemption victims found for incoming pod."}]}
CREATING = {"phase": "Pending", "qosClass": "Guaranteed", "startTime": T0,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": T0}],
            "containerStatuses": [container_status({"waiting": {"reason": "ContainerCreating"}})]}
RUNNING = {"phase": "Running", "qosClass": "Guaranteed", "startTime": T0, "podIP": "10.244.1.7",
           "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T0}],
           "containerStatuses": [{**container_status({"running": {"startedAt": T0}}), "ready": True, "started": True}]}
PULL_FAILED = {**CREATING, "containerStatuses": [container_status({"waiting": {
    "reason": "ImagePullBackOff",
    "message": 'Back-off pulling image "registry.example.com/temper-workload:0.1.0"'}})]}
OOM_KILLED = {"phase": "Failed", "qosClass": "Guaranteed", "startTime": T0, "containerStatuses": [container_status(
    {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": T0, "finishedAt": T0}})]}
DEADLINE = {"phase": "Failed", "reason": "DeadlineExceeded",
            "message": "Pod was active on the node longer than the specified deadline", "startTime": T0,
            "containerStatuses": [container_status({"terminated": {"exitCode": 137, "reason": "Error",
                                                                   "startedAt": T0, "finishedAt": T0}})]}
CGROUP_EVENTS = "low 0\nhigh 0\nmax {n}\noom {n}\noom_kill {n}\noom_group_kill 0\n"


class FakeClusterApi:
    """Fake of ClusterApi.create/read_pod/delete/exec (see the module docstring)."""

    def __init__(self, statuses=(RUNNING,), create_error: ApiException | None = None):
        self.statuses, self.create_error = list(statuses), create_error
        self.pods: dict[str, k.V1Pod] = {}
        self.deleted: list[tuple[str, str]] = []
        self.execs = 0
        self.exec_hook = None  # replaces one exec's outcome: what the API returns when the container dies

    def create(self, obj):
        kubernetes_validate.validate(m.to_dict(obj), "1.33", strict=True)  # what the API server would reject
        if self.create_error is not None:
            raise self.create_error
        self.pods[obj.metadata.name] = obj
        return obj

    def read_pod(self, namespace, name):
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        doc = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return self.pods[name].model_copy(update={"status": k.V1PodStatus.model_validate(doc)})

    def delete(self, kind, namespace, name):
        self.deleted.append((kind, name))
        self.pods.pop(name, None)

    def exec(self, namespace, pod, container, argv, stdin, timeout_s):
        assert pod in self.pods and container == m.MAIN_CONTAINER and namespace == OPTS.sandbox_ns
        self.execs += 1
        if self.exec_hook is not None:
            hook, self.exec_hook = self.exec_hook, None
            return hook()
        try:
            p = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            return None, e.stdout or b"", e.stderr or b""
        return p.returncode, p.stdout, p.stderr


@pytest.fixture
def pod_fs(tmp_path):
    """The sandbox pod's filesystem as the fake exec sees it."""
    for d in ("work", "tmp", "cgroup"):
        (tmp_path / d).mkdir()
    (tmp_path / "cgroup/memory.events").write_text(CGROUP_EVENTS.format(n=0))
    return PodLayout(work_dir=str(tmp_path / "work"), tmp_dir=str(tmp_path / "tmp"), python=sys.executable,
                     oom_files=(str(tmp_path / "cgroup/memory.events"),))


def _backend(api, layout, **kw):
    slept = []
    now = [0.0]

    def sleep(s):
        slept.append(s)
        now[0] += s
    return KubernetesBackend(api, OPTS, layout=layout, clock=lambda: now[0], sleep=sleep, poll_s=1.0, **kw), slept, now


# --- creating a box -----------------------------------------------------------------------------
def test_box_is_a_restricted_pod_that_waits_until_running(pod_fs):
    api = FakeClusterApi([SCHEDULING, CREATING, CREATING, RUNNING])
    backend, slept, _ = _backend(api, pod_fs)
    assert isinstance(backend, Backend)
    box = backend.create_box(PY)
    assert isinstance(box, Box) and slept == [1.0, 1.0, 1.0]
    (pod,) = api.pods.values()
    doc = m.to_dict(pod)
    assert doc["metadata"]["labels"][m.ROLE_LABEL] == m.SANDBOX_ROLE  # the deny-all NetworkPolicy selects it
    spec = doc["spec"]
    assert spec["activeDeadlineSeconds"] == OPTS.sandbox_lifetime_s and spec["automountServiceAccountToken"] is False
    assert spec["runtimeClassName"] == "gvisor" and restricted_violations(spec) == []
    assert spec["containers"][0]["command"] == ["sleep", str(OPTS.sandbox_lifetime_s)]  # idle PID 1
    assert box.id == pod.metadata.name and box.healthy()
    box.close()
    box.close()
    assert api.deleted == [("Pod", box.id)] and not box.healthy()


def test_a_box_made_in_a_jobs_pod_carries_the_jobs_name(pod_fs, monkeypatch):
    """The launcher deletes the boxes a job left by this label (test_k8s_standin_jobs: no sandbox pod outlives
    its job); the job's pods say their job in their job settings (TEMPER_JOB), which the pool's backend reads."""
    from infra.k8s import api as cluster_api
    from infra.sandbox import pool
    from temper.core.settings import get_settings, with_job

    api = FakeClusterApi([RUNNING])
    backend, _, _ = _backend(api, pod_fs, owner="eval-pt-1234")
    box = backend.create_box(PY)
    labels = api.pods[box.id].metadata.labels
    assert labels[m.OWNER_LABEL] == "eval-pt-1234" and labels[m.ROLE_LABEL] == m.SANDBOX_ROLE
    box.close()
    assert m.OWNER_LABEL not in m.sandbox_pod("sandbox-y", OPTS, 600).metadata.labels  # made outside any job

    monkeypatch.setenv("TEMPER_JOB", with_job({}, sandbox_owner="eval-pt-1234")["TEMPER_JOB"])
    monkeypatch.setenv("TEMPER_SANDBOX_BACKEND", "kubernetes")
    monkeypatch.setattr(cluster_api, "load_config", lambda context=None: None)
    get_settings.cache_clear()
    try:
        made = pool._make_backend()
    finally:
        get_settings.cache_clear()
    assert isinstance(made, KubernetesBackend) and made.owner == "eval-pt-1234"


def test_image_pull_failure_deletes_the_pod(pod_fs):
    api = FakeClusterApi([CREATING, PULL_FAILED])
    backend, _, _ = _backend(api, pod_fs)
    with pytest.raises(SandboxError, match=r"did not start: ImagePullBackOff: Back-off pulling image"):
        backend.create_box(PY)
    assert len(api.deleted) == 1 and not api.pods


def test_unschedulable_pod_times_out_with_the_schedulers_words(pod_fs):
    api = FakeClusterApi([SCHEDULING])
    backend, slept, now = _backend(api, pod_fs)
    with pytest.raises(SandboxError, match=r"not running after 60s \(Unschedulable: 0/3 nodes are available: "
                                           r"3 Insufficient cpu"):
        backend.create_box(PY)
    assert now[0] == OPTS.sandbox_start_timeout_s and len(api.deleted) == 1


def test_forbidden_create_names_rbac_and_leaves_nothing(pod_fs):
    api = FakeClusterApi(create_error=ApiException(status=403, reason="Forbidden"))
    backend, _, _ = _backend(api, pod_fs)
    with pytest.raises(SandboxError, match="403 Forbidden.*temper-flow-runner"):
        backend.create_box(PY)
    assert api.deleted == [] and api.pods == {}


def test_interrupt_while_waiting_still_deletes_the_pod(pod_fs):
    api = FakeClusterApi([CREATING])

    def interrupted(_):
        raise KeyboardInterrupt
    backend = KubernetesBackend(api, OPTS, layout=pod_fs, sleep=interrupted)
    with pytest.raises(KeyboardInterrupt):
        backend.create_box(PY)
    assert len(api.deleted) == 1 and not api.pods


# --- running: verdicts --------------------------------------------------------------------------
@pytest.fixture
def box(pod_fs):
    api = FakeClusterApi()
    backend, _, _ = _backend(api, pod_fs)
    b = backend.create_box(PY)
    yield b
    b.close()


def test_program_output_stdin_env_and_exit_code(box):
    box.write_files({"main.py": "import os, sys\ndata = sys.stdin.read()\nprint(data.upper(), os.environ['X'])\n"
                                "print('warn', file=sys.stderr)\nsys.exit(3)\n"})
    r = box.run(PY.code_argv, FAST, stdin=b"hello", env={"X": "42"})
    assert (r.verdict, r.exit_code, r.signal) == ("ok", 3, None) and not r.ok
    assert r.stdout == "HELLO 42\n" and r.stderr == "warn\n" and r.wall_s > 0


def test_timeout_is_enforced_in_the_pod(box):
    r = box.run(["python3", "-c", "import time; print('start', flush=True); time.sleep(30)"], FAST.merged(wall_s=0.5))
    assert r.verdict == "timeout" and r.signal == 9 and r.stdout == "start\n" and r.wall_s < 5


def test_cpu_limit_is_its_own_verdict(box):
    r = box.run(["python3", "-c", "while True: pass"], FAST.merged(cpu_s=1, wall_s=20))
    assert r.verdict == "cpu_limit" and r.signal == 24 and r.cpu_s > 0.5  # SIGXCPU (rusage is tick-accurate only)


def test_address_space_limit_is_memory(box):
    r = box.run(["python3", "-c", "x = bytearray(3 * 2**30)"], FAST)
    assert r.verdict == "memory" and r.exit_code == 1 and "MemoryError" in r.stderr


def test_cgroup_oom_kill_is_memory_not_killed(box, pod_fs):
    """The kernel's OOM killer leaves a bare SIGKILL; the cgroup's oom_kill counter tells them apart."""
    events = pod_fs.oom_files[0]
    oom = (f"import os, signal; open({events!r}, 'w').write({CGROUP_EVENTS.format(n=1)!r}); "
           "os.kill(os.getpid(), signal.SIGKILL)")
    r = box.run(["python3", "-c", oom], FAST)
    assert (r.verdict, r.signal) == ("memory", 9)
    r = box.run(["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], FAST)
    assert (r.verdict, r.signal) == ("killed", 9)  # counter unchanged: not an OOM kill


def test_output_cap_kills_the_run(box):
    r = box.run(["python3", "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"],
                FAST.merged(output_bytes=100_000))
    assert r.verdict == "output_limit" and r.truncated and len(r.stdout) == 100_000


def test_missing_program_and_forged_trailer(box):
    r = box.run(["no-such-program"], FAST)
    assert (r.verdict, r.exit_code) == ("ok", 127) and "no-such-program" in r.stderr
    forged = 'import sys; sys.stderr.write("\\n" + "0" * 32 + \' {"timed_out": true}\\n\'); sys.exit(0)'
    r = box.run(["python3", "-c", forged], FAST)
    assert (r.verdict, r.exit_code) == ("ok", 0) and r.stderr == "\n" + "0" * 32 + ' {"timed_out": true}\n'


def test_strays_die_and_tmp_is_fresh_each_run(box):
    tmp = box.backend.layout.tmp_dir
    assert box.run(["python3", "-c", f"open({tmp!r} + '/left', 'w')"], FAST).ok
    r = box.run(["python3", "-c", f"import os; print(os.listdir({tmp!r}))"], FAST)
    assert r.stdout == "[]\n"
    r = box.run(["bash", "-c", "sleep 30 & echo $!"], FAST)  # holds the pipes after bash exits
    assert r.ok and r.wall_s < 5
    r = box.run(["bash", "-c", f"kill -0 {int(r.stdout)} 2>/dev/null && echo alive || echo gone"], FAST)
    assert r.stdout == "gone\n"


# --- files --------------------------------------------------------------------------------------
def test_files_snapshot_restore_reset(box):
    box.write_files({"a/b.txt": "one", "data.bin": b"\x00\x01"})
    assert box.read_file("a/b.txt") == b"one" and box.read_file("data.bin", max_bytes=1) == b"\x00"
    snap = box.snapshot()
    box.reset()
    with pytest.raises(SandboxError, match="No such file"):
        box.read_file("a/b.txt")
    box.restore(snap)
    assert box.read_file("a/b.txt") == b"one"
    r = box.run(["bash", "-c", "ln -s /etc/hostname link; mkdir d"], FAST)
    assert r.ok
    with pytest.raises(SandboxError):
        box.read_file("link")  # O_NOFOLLOW
    with pytest.raises(SandboxError, match="not a regular file"):
        box.read_file("d")
    execs = box.backend.api.execs
    for bad in ("../escape", "/etc/passwd", ""):
        with pytest.raises(SandboxError, match="must be relative"):
            box.read_file(bad)
        with pytest.raises(SandboxError, match="must be relative"):
            box.write_files({bad: "x"})
    assert box.backend.api.execs == execs  # refused before anything reached the pod


# --- the pod failing under the box --------------------------------------------------------------
def test_container_oom_kill_mid_run_is_memory_and_retires_the_box(box):
    api = box.backend.api
    api.exec_hook = lambda: (137, b"partial", b"")  # the executor died with its container: no report
    api.statuses = [OOM_KILLED]
    r = box.run(["python3", "-c", "x = 'a' * 2**31"], FAST)
    assert r.verdict == "memory" and "OOM-killed" in r.stderr and r.stdout == "partial"
    assert not box.healthy()


def test_a_snapshot_is_bounded_in_the_pod_before_anything_is_read(box):
    """The executor walks the work dir with lstat under the request's StateLimits (the shipped copy of
    infra.sandbox.snapshot) and refuses it, with its reason, before reading or sending a byte."""
    import io
    import tarfile

    from infra.sandbox.api import StateLimitError
    from infra.sandbox.snapshot import StateLimits

    assert box.run(["bash", "-c", "for i in $(seq 16); do truncate -s 63M .s$i; done"], FAST).ok
    with pytest.raises(StateLimitError, match=r"over its snapshot limits: '\.s1' brings the files to more than 4000000"):
        box.snapshot(StateLimits(max_bytes=4_000_000))
    box.reset()
    assert box.run(["bash", "-c", "mkfifo pipe; echo x > a"], FAST).ok
    with pytest.raises(StateLimitError, match="'pipe' is a fifo"):
        box.snapshot()
    assert box.run(["bash", "-c", "rm pipe; ln -s a link"], FAST).ok
    with pytest.raises(StateLimitError, match="'link' is a symlink"):
        box.snapshot(StateLimits(links=False))
    with tarfile.open(fileobj=io.BytesIO(box.snapshot())) as tar:
        assert [(t.name, t.issym()) for t in tar] == [("a", False), ("link", True)]
    assert not box.broken  # a refused snapshot is the work dir's fault, not the pod's


def test_exec_failure_is_an_error_verdict_and_retires_the_box(box):
    def boom():
        raise KubernetesError("exec in pod 'x': connection failed: Handshake status 500")
    box.backend.api.exec_hook = boom
    r = box.run(["true"], FAST)
    assert r.verdict == "error" and "Handshake status 500" in r.stderr and not box.healthy()
    box.close()
    with pytest.raises(SandboxError, match="is closed"):
        box.run(["true"], FAST)


def test_health_follows_the_pod_and_its_deadline(pod_fs):
    api = FakeClusterApi()
    backend, _, now = _backend(api, pod_fs)
    b = backend.create_box(PY)
    assert b.healthy()
    now[0] = OPTS.sandbox_lifetime_s - 30  # the cluster kills it soon: hand it out no more
    assert not b.healthy()
    b2 = backend.create_box(PY)
    api.statuses = [DEADLINE]
    assert not b2.healthy()
    b.close(), b2.close()


# --- the platform API on top --------------------------------------------------------------------
def test_one_shot_run_and_pool_over_the_kubernetes_backend(pod_fs):
    api = FakeClusterApi()
    backend, _, _ = _backend(api, pod_fs)
    r = sandbox.run(code="print(6 * 7)", backend=backend)
    assert r.ok and r.stdout == "42\n" and len(api.deleted) == 1 and not api.pods
    with SandboxPool("python", size=1, spare=0, backend=backend) as pool:
        outs = [pool.submit(code="import os; open('mine', 'w'); print(sorted(os.listdir()))").result() for _ in range(2)]
        assert [o.stdout for o in outs] == ["['main.py', 'mine']\n"] * 2  # reset between tasks
    assert not api.pods  # the pool closed (deleted) its boxes


def test_framing_round_trip():
    layout = PodLayout()
    raw = frame("run", "n0", layout, b"payload", argv=["x"])
    header, rest = raw.split(b"\n", 1)
    assert rest[int(header):] == b"payload" and b'"work_dir": "/work"' in rest[: int(header)]
    err, trailer = split_trailer(b"program\n\nn0 {\"exit_code\": 0}\n", "n0")
    assert err == b"program\n" and trailer == {"exit_code": 0}
    assert split_trailer(b"no trailer", "n0") == (b"no trailer", None)
