"""Execution families: HumanEval-style unit tests and shell end-state checks.

Interim runner: a plain subprocess in a fresh temporary directory with a wall-clock
timeout, a scrubbed environment and its own process group (killed whole on timeout).
That is NOT isolation (no namespaces, no rlimits): the bubblewrap sandbox of issue 4
replaces ``_run`` without changing these classes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

from temper.verifiers.base import Verdict, Verifier
from temper.verifiers.registry import register

_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}


def _run(argv: list[str], cwd: str, timeout_s: float) -> tuple[int | None, str]:
    proc = subprocess.Popen(argv, cwd=cwd, env=_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out[-2000:].decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, "timeout"


@register
class CodeTestsVerifier(Verifier):
    """Reward 1 when prompt + completion passes the record's ``check(candidate)``."""

    family = "code_tests"
    sandbox_profile = "python"

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        if not all(k in record for k in ("prompt", "test", "entry_point")):
            return None
        program = f"{record['prompt']}{completion}\n\n{record['test']}\ncheck({record['entry_point']})\n"
        with tempfile.TemporaryDirectory(prefix="temper-code-") as tmp:
            with open(os.path.join(tmp, "main.py"), "w") as f:
                f.write(program)
            code, out = _run([sys.executable, "-I", "main.py"], tmp, float(self.params.get("timeout_s", 5)))
        return Verdict(1.0 if code == 0 else 0.0, {"exit_code": code, "output": out[-500:]})


@register
class TerminalVerifier(Verifier):
    """setup builds the task files, the completion's commands run, the check script decides (exit 0)."""

    family = "terminal"
    sandbox_profile = "shell"

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        if not all(k in record for k in ("setup", "check")):
            return None
        timeout = float(self.params.get("timeout_s", 10))
        with tempfile.TemporaryDirectory(prefix="temper-sh-") as tmp:
            code, out = _run(["bash", "-c", record["setup"]], tmp, timeout)
            if code != 0:
                return None  # the task itself is broken: not the model's fault
            run_code, run_out = _run(["bash", "-c", completion], tmp, timeout)
            check_code, _ = _run(["bash", "-c", record["check"]], tmp, timeout)
        return Verdict(1.0 if check_code == 0 else 0.0, {"commands_exit": run_code, "output": run_out[-500:]})
