"""Repository repair as an episode: fix a small Python project's bugs in a sandbox; hidden tests decide.

A ``repair_tasks`` record (``temper.data.generators_repair``) carries a project: a package with
injected bugs, its visible tests and ``run_tests.py``. The agent works in one sandbox session as in
``file_tasks`` (``<bash>`` to run the tests and read files, ``<write>`` to change them) until
``<done/>``. The reward is not the visible tests: the package's ``.py`` files are read out of the
box (nothing else of the final tree: not the tests, not a ``conftest.py``, not a ``sitecustomize``)
and the record's *hidden* cases run against them in a fresh box of the ``python`` pool through
``repair_harness.py``, where the project answers calls in a forked child and a trusted parent
compares. Reward 1 only when every hidden case passes. So editing or deleting the visible tests,
hard-coding their answers, exiting early, printing "PASSED" or patching a runner earns nothing.
"""

from __future__ import annotations

import io
import json
import secrets
import tarfile
from pathlib import Path
from typing import Any

from infra.sandbox import shared_pool
from infra.sandbox.forkserver import SERVER_ENDED
from temper.agent.environment import EpisodeLimits
from temper.agent.files import FilesEnvironment
from temper.agent.repair_harness import CASES_FILE

HARNESS_FILE = ".temper_repair.py"
HARNESS = Path(__file__).with_name("repair_harness.py").read_text()
MAX_MODULE_BYTES = 200_000


def package_sources(archive: bytes, package: str) -> dict[str, str]:
    """{path: text} of the regular ``.py`` files under ``package/`` in a work-dir snapshot: what the
    hidden tests import. Anything else in the tree (links, bytecode, tests, files elsewhere) is left out."""
    out: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            if not (member.isfile() and name.startswith(package + "/") and name.endswith(".py")
                    and ".." not in name.split("/") and member.size <= MAX_MODULE_BYTES):
                continue
            try:
                out[name] = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
            except UnicodeDecodeError:
                continue
    return out


def hidden_tests(pool: Any, package: str, sources: dict[str, str], cases: list[dict[str, Any]]) -> tuple[int, int, str]:
    """(passed, total, stderr tail) of the hidden cases against ``sources`` in a fresh box of ``pool``.
    A run that ends without the harness' token line (killed, timed out, its box's fork server killed by the
    project's code) passed nothing; RuntimeError when the sandbox itself failed."""
    token = secrets.token_hex(16)
    files = {**sources, HARNESS_FILE: HARNESS, CASES_FILE: json.dumps(cases)}
    result = pool.exec(["python3", "-I", HARNESS_FILE, package], files=files,
                       limits=pool.profile.limits, stdin=f"{token}\n".encode())
    if result.verdict in ("error", "not_started") and SERVER_ENDED not in result.stderr:
        raise RuntimeError(f"hidden tests: sandbox failed: {result.stderr.strip()[-300:]}")
    for line in reversed(result.stdout.splitlines()):
        parts = line.split()
        if len(parts) == 3 and parts[0] == token and parts[1].isdigit() and parts[2].isdigit():
            return int(parts[1]), int(parts[2]), result.stderr[-500:]
    return 0, len(cases), f"[{result.verdict}] {result.stderr[-500:]}"


class RepairEnvironment(FilesEnvironment):
    """A ``repair_tasks`` record: ``start_files`` (the buggy project) in a fresh box, a files-style
    session, reward when every case of ``hidden_tests`` passes on the package's final sources."""

    name = "repair"

    def __init__(self, limits: EpisodeLimits | None = None, pool: Any = None, queue_timeout_s: float = 60.0,
                 judge_pool: Any = None) -> None:
        super().__init__(limits, pool, queue_timeout_s)
        self._judge_pool = judge_pool
        self.hidden: tuple[int, int] = (0, 0)  # (passed, total) of the last check

    @property
    def judge_pool(self):
        if self._judge_pool is None:
            self._judge_pool = shared_pool("python")
        return self._judge_pool

    def _end_state_ok(self) -> bool:
        archive = self._work_dir()
        if archive is None:
            return False
        package = self.record["package"]
        cases = json.loads(self.record["hidden_tests"])
        passed, total, log = hidden_tests(self.judge_pool, package, package_sources(archive, package), cases)
        self.hidden = (passed, total)
        if passed != total:
            self.reason = f"hidden tests: {passed}/{total} passed; {log.strip()[-300:]}"
        return total > 0 and passed == total
