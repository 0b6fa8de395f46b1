"""The ``files`` environment: a sandboxed work dir that must end in an exact state (``file_tasks``).

Each episode gets a freshly wiped box from the warm pool and gives it back wiped
(``SandboxPool.release``); the end state is read out of the box as a tar archive within
``END_STATE_LIMITS``, checked before any file is read, so what a box holds cannot make the check costly.
"""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

from infra.sandbox import SandboxError, Session, shared_pool
from infra.sandbox.api import StateLimitError, safe_relpath
from infra.sandbox.snapshot import StateLimits
from temper.agent.environment import Action, EpisodeEnvironment, EpisodeLimits, Outcome, truncate

MAX_STATE_BYTES = 4_000_000
# What the end-state check reads from the box, checked with lstat before any file is opened: the
# expected states are a few small files, and anything past these (a sparse 63 MiB file, thousands
# of files, a deep tree, a link, a fifo) could never match, so it scores 0 unread.
END_STATE_LIMITS = StateLimits(max_bytes=MAX_STATE_BYTES, max_files=1000, max_depth=16, links=False)


def work_dir_files(archive: bytes) -> dict[str, str] | None:
    """{path: text} of the regular files of a work-dir snapshot; None when it holds anything else
    (a symlink, a device, undecodable or oversized content), which never matches an expected state."""
    if len(archive) > MAX_STATE_BYTES:
        return None
    files: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        for member in tar.getmembers():
            if member.isdir():
                continue
            if not member.isfile():
                return None
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            try:
                files[member.name] = data.decode()
            except UnicodeDecodeError:
                return None
    return files


def file_state_matches(got: dict[str, str] | None, expected: dict[str, str]) -> bool:
    """Same set of files, same contents (a trailing newline aside). Empty directories do not count."""
    if got is None or set(got) != set(expected):
        return False
    return all(got[p].rstrip("\n") == expected[p].rstrip("\n") for p in expected)


class FilesEnvironment(EpisodeEnvironment):
    """A ``file_tasks`` record: ``start_files`` written into a fresh sandbox box, shell commands and
    file writes run in one sandbox session, reward when the work dir holds exactly ``end_files``."""

    name = "files"
    holds_box = True
    kinds = ("bash", "write", "done")

    def __init__(self, limits: EpisodeLimits | None = None, pool: Any = None, queue_timeout_s: float = 60.0) -> None:
        super().__init__(limits)
        self._pool, self.queue_timeout_s = pool, queue_timeout_s
        self.session: Any = None

    @property
    def pool(self):
        if self._pool is None:
            self._pool = shared_pool("shell")
        return self._pool

    def _start(self, record: dict[str, Any]) -> str:
        start = json.loads(record["start_files"])
        limits = self.pool.profile.limits.merged(wall_s=self.limits.step_timeout_s)
        # record=False: the episode keeps its own trajectory (observations cut to the domain's size)
        self.session = Session(self.pool.acquire(timeout=self.queue_timeout_s), limits, record=False)
        if start:
            self.session.write_files(start)
        return record["instruction"]

    def _act(self, action: Action, timeout_s: float) -> tuple[str, Outcome | None]:
        if action.kind == "write":
            try:
                self.session.write_files({safe_relpath(action.path): action.content})
            except SandboxError as e:
                return f"[write refused] {e}", None
            return f"[wrote {len(action.content)} chars to {action.path}]", None
        r = self.session.run(action.command, timeout=timeout_s)
        if r.verdict in ("error", "not_started"):  # bash itself did not start: the box is broken
            raise RuntimeError(r.stderr[-300:] or "sandbox error")
        text = r.stdout + (("\n[stderr]\n" + r.stderr) if r.stderr else "")
        status = f"[exit {r.exit_code}]" if r.verdict == "ok" else f"[{r.verdict}]"
        observation = f"{truncate(text, self.limits.max_observation_chars).rstrip()}\n{status}".lstrip("\n")
        return observation, (None if r.verdict == "ok" else r.verdict)

    def _work_dir(self) -> bytes | None:
        """The work dir as a tar within ``END_STATE_LIMITS``; None (with the limit as ``reason``) past them:
        the model's doing, not the sandbox's, so a wrong end state."""
        try:
            return self.session.box.snapshot(END_STATE_LIMITS)
        except StateLimitError as e:
            self.reason = str(e)
            return None

    def _end_state_ok(self) -> bool:
        archive = self._work_dir()
        return archive is not None and file_state_matches(work_dir_files(archive),
                                                          json.loads(self.record["end_files"]))

    def _release(self) -> None:
        if self.session is not None:
            box, self.session = self.session.box, None
            self.pool.release(box)  # wiped before anyone else gets it
