"""The sandbox contract: limits, results, and the backend interface every runtime implements.

A *box* is one prepared sandbox: a private work directory that commands run in, one at a
time, each under its own limits, each leaving no process behind. A *backend* makes boxes
(``bwrap`` here on one machine, Kubernetes pods on a cluster). The warm pool, sessions and
verifiers only talk to these two protocols, so a backend is swappable without touching them.

Box methods are blocking; the pool runs them in worker threads. Paths given to
``write_files``/``read_file`` are relative to the work dir and must stay inside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from infra.sandbox.snapshot import StateLimits
from temper.core.errors import TemperError

Outcome = Literal["ok", "timeout", "cpu_limit", "memory", "output_limit", "killed", "not_started", "error"]
"""ok: ran to its own exit (any exit code); timeout: wall-clock limit; cpu_limit: CPU limit;
memory: address-space limit hit (the loader failing to map the program under it included);
output_limit: stdout+stderr or a written file exceeded its cap; killed: died of a signal nobody in
the sandbox runtime sent; not_started: the program never ran (no such command or file, not
executable, a library missing), exit code 127 or 126; error: the sandbox itself failed (not the program)."""


class SandboxError(TemperError):
    """The sandbox could not be set up or used (missing bwrap, bad path, pool closed)."""


class StateLimitError(SandboxError):
    """A work dir holds more than a snapshot may read (``StateLimits``): refused before reading it."""


class Limits(BaseModel):
    """Resource limits of one execution. Every run gets all of them; there is no 'unlimited'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    wall_s: float = Field(default=10.0, gt=0, le=3600, description="Wall-clock timeout; the whole process tree is killed.")
    cpu_s: int = Field(default=10, gt=0, le=3600, description="RLIMIT_CPU per process (seconds of CPU).")
    memory_mb: int = Field(default=1024, ge=16, description="RLIMIT_AS per process (virtual address space, MiB).")
    nproc: int = Field(default=64, ge=1, description="RLIMIT_NPROC inside the sandbox's own user namespace.")
    fsize_mb: int = Field(default=64, ge=1, description="RLIMIT_FSIZE: largest file a process may write (MiB).")
    nofile: int = Field(default=256, ge=16, description="RLIMIT_NOFILE: open file descriptors per process.")
    output_bytes: int = Field(default=1_000_000, ge=1024, description="stdout+stderr kept; more kills the run.")
    tmp_mb: int = Field(default=64, ge=1, description="Size of the private /tmp tmpfs (MiB).")
    disk_mb: int = Field(default=256, ge=1, description="Size of the work dir where the backend can give it its "
                         "own filesystem (bwrap as root: a tmpfs per box); fixed when the box is made.")

    def merged(self, **overrides: float | int | None) -> "Limits":
        """A copy with the non-None overrides applied (CLI flags, verifier params)."""
        return self.model_copy(update={k: v for k, v in overrides.items() if v is not None})


class Profile(BaseModel):
    """A named kind of sandbox: default limits plus how a code snippet is run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    limits: Limits
    code_file: str = Field(description="File the code of a code request is written to, in the work dir.")
    code_argv: list[str] = Field(description="Command that runs code_file.")
    ro_paths: tuple[str, ...] = Field(default=(), description="Host directories bound read-only under /opt/ro "
                                      "(see ro_mount) in every run and put on the fork server's sys.path, e.g. "
                                      "a site-packages whose library the runs use.")
    preload: str | None = Field(default=None, description="Python source the fork server runs once before it "
                                "serves (module __temper_preload__), so what every run needs (a big import) "
                                "is paid per warm box, not per run.")


PROFILES: dict[str, Profile] = {
    # 1.5 GB address space: Python with a few threads needs ~1 GB of mappings (8 MB stacks + arenas).
    "python": Profile(name="python", limits=Limits(wall_s=10, cpu_s=10, memory_mb=1536, nproc=32),
                      code_file="main.py", code_argv=["python3", "-I", "main.py"]),
    "shell": Profile(name="shell", limits=Limits(wall_s=20, cpu_s=20, memory_mb=1024, nproc=128),
                     code_file="main.sh", code_argv=["bash", "main.sh"]),
}


def ro_mount(host_path: str) -> str:
    """Where a profile's read-only host directory appears inside the sandbox (never under /work)."""
    return "/opt/ro/" + host_path.strip("/")


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise SandboxError(f"unknown sandbox profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


class Result(BaseModel):
    """What one execution did. ``verdict`` says how it ended, ``exit_code`` what the program said."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = Field(default=None, description="Exit status; None when killed by a signal.")
    signal: int | None = Field(default=None, description="Signal that ended the program, if any.")
    verdict: Outcome
    wall_s: float = 0.0
    cpu_s: float = Field(default=0.0, description="User + system CPU of the program and the children it "
                         "waited for; a run stopped at its time or output limit is ended leaves first, so it "
                         "counts too (processes still forking past the stop are not counted).")
    max_rss_mb: float = Field(default=0.0, description="Largest resident set of any process counted in cpu_s.")
    truncated: bool = Field(default=False, description="Output was cut at Limits.output_bytes.")

    @property
    def ok(self) -> bool:
        """Ran to completion and exited 0."""
        return self.verdict == "ok" and self.exit_code == 0


def safe_relpath(path: str) -> str:
    """Reject absolute paths and '..' so a file name from a record cannot escape the work dir."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts:
        raise SandboxError(f"file path {path!r} must be relative and stay inside the work dir")
    return str(p)


@runtime_checkable
class Box(Protocol):
    """One prepared sandbox. Not thread-safe: one caller (the pool's lease holder) at a time."""

    id: str

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Create/overwrite files in the work dir (parents created)."""

    def read_file(self, path: str, max_bytes: int = 1_000_000) -> bytes:
        """Read a file of the work dir; SandboxError if it is missing or not a regular file."""

    def run(self, argv: list[str], limits: Limits, stdin: bytes | None = None,
            env: Mapping[str, str] | None = None) -> Result:
        """Run argv with cwd = work dir under limits; return when it and all its children are gone."""

    def snapshot(self, limits: StateLimits | None = None) -> bytes:
        """The work dir's files as a tar archive (for Session.snapshot, replay, an end-state check);
        StateLimitError, before any file is read, when it breaks ``limits`` (default ``StateLimits()``)."""

    def restore(self, archive: bytes) -> None:
        """Replace the work dir's content with a snapshot."""

    def reset(self) -> None:
        """Reclaim for the next user: work dir emptied, no process of earlier runs alive."""

    def healthy(self) -> bool:
        """False when the box cannot be reused (then the pool closes and replaces it)."""

    def close(self) -> None:
        """Free everything the box holds. Idempotent."""

    # Optional: ``warm(self) -> None`` starts whatever can be started ahead of the next run (the
    # pool calls it when the box becomes idle; the next ``run`` must still honour its own limits).


@runtime_checkable
class Backend(Protocol):
    """Makes boxes. ``name`` shows up in results and benchmarks ('bwrap', 'kubernetes', ...)."""

    name: str

    def create_box(self, profile: Profile) -> Box:
        """A ready box for this profile; SandboxError when the runtime is unavailable."""
