"""Sandboxed execution of untrusted code (model completions, agent commands).

The contract is ``infra.sandbox.api`` (limits, results, the Box/Backend protocols). The local
backend is bubblewrap (``infra.sandbox.bwrap``); ``infra.sandbox.pool`` keeps boxes warm and
schedules executions; ``infra.sandbox.session`` holds one box across the steps of an episode.

``run`` is the one-shot, cold path: a new box, one execution, box gone.
"""

from __future__ import annotations

from collections.abc import Mapping

from infra.sandbox.api import PROFILES, Backend, Box, Limits, Profile, Result, SandboxError, get_profile
from infra.sandbox.pool import PoolFull, QueueTimeout, SandboxPool, default_backend, request_argv, shared_pool
from infra.sandbox.session import Session


def run(command: list[str] | str | None = None, code: str | None = None, *, files: Mapping[str, str | bytes] | None = None,
        profile: str = "python", timeout: float | None = None, limits: Limits | None = None,
        stdin: bytes | None = None, backend: Backend | None = None) -> Result:
    """Run a command (argv, or a bash string) or a code snippet in a fresh sandbox."""
    prof = get_profile(profile)
    lim = (limits or prof.limits).merged(wall_s=timeout)
    argv, extra = request_argv(prof, command, code)
    box = (backend or default_backend()).create_box(prof)
    try:
        if files or extra:
            box.write_files({**(files or {}), **extra})
        return box.run(argv, lim, stdin=stdin)
    finally:
        box.close()


exec = run  # noqa: A001 - the name the platform's docs use: infra.sandbox.exec(...)

__all__ = ["PROFILES", "Backend", "Box", "Limits", "PoolFull", "Profile", "QueueTimeout", "Result", "SandboxError",
           "SandboxPool", "Session", "exec", "get_profile", "run", "shared_pool"]
