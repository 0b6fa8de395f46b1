"""Execution families: HumanEval-style unit tests and shell end-state checks, in the sandbox.

Both run in ``infra.sandbox`` boxes from the process-wide warm pool of their profile, so a
GRPO batch of completions executes concurrently up to the pool size, isolated and limited.

code_tests: the problem's tests run in a trusted harness process and the completion in a forked
child that only answers calls of the entry point with plain values (see code_harness.py), so no
completion can fake a pass: exiting early, printing, monkeypatching ``check``, reaching for the
harness' token or returning an always-equal object all score 0. Default: the benchmark's own rule,
1 only when every assert passes. ``partial: true`` (opt-in per domain) pays the share of asserts
passed, counting only asserts that a do-nothing candidate fails, so a stub earns nothing.

terminal: the record's setup script builds the task in a fresh session, the completion's
commands run in it, then the check script decides (exit 0) in a *clean* shell state, so a
completion cannot pass by exporting a PATH with a fake ``test``. ``mode: output`` (NL2Bash-style
records without a check) instead snapshots the work dir after setup, runs the reference,
restores the snapshot, runs the completion and compares the two outputs line by line. A failing setup means the task
itself is broken: None, not 0. Sandbox overload (queue deadline, back-pressure) is also None.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import PositiveFloat, PositiveInt

from infra.sandbox import Session, shared_pool
from infra.sandbox.forkserver import SERVER_ENDED
from infra.sandbox.pool import QueueTimeout
from temper.verifiers.base import Verdict, Verifier, not_judged
from temper.verifiers.pooled import PooledVerifier

log = logging.getLogger(__name__)

HARNESS_FILE = ".temper_harness.py"
HARNESS = Path(__file__).with_name("code_harness.py").read_text()


def _limits(pool, params: dict[str, Any]):
    return pool.profile.limits.merged(wall_s=params.get("timeout_s"), memory_mb=params.get("memory_mb"))


def _tally(stdout: str, token: str) -> tuple[int, int, int] | None:
    """(ok, passed, total) from the harness' last line that starts with this run's token."""
    for line in reversed(stdout.splitlines()):
        parts = line.split()
        if len(parts) == 4 and parts[0] == token and all(p.isdigit() for p in parts[1:]):
            return int(parts[1]), int(parts[2]), int(parts[3])
    return None


def _prelude(prompt: str) -> str:
    """The prompt as the tests' own module (its helpers, imports): as is when it compiles (HumanEval
    prompts end in a docstring), else with a ``pass`` body, else nothing. Compiled here, never run."""
    for source in (prompt, prompt.rstrip("\n") + "\n    pass\n"):
        try:
            compile(source, "prompt", "exec")
            return source
        except (SyntaxError, ValueError):
            continue
    return ""


class CodeTestsVerifier(PooledVerifier):
    """params: timeout_s (profile default 10), memory_mb, partial (default false: the benchmark's
    rule, 1 only when every assert passes; true: share of the asserts that a do-nothing candidate
    does not already pass)."""

    family = "code_tests"
    known_params = {"timeout_s": PositiveFloat, "memory_mb": PositiveInt, "partial": bool}
    sandbox_profile = "python"
    input_fields = ("prompt",)

    def _job(self, record: dict[str, Any], completion: str):
        missing = [k for k in ("prompt", "test", "entry_point") if not record.get(k)]
        if missing:
            return not_judged(f"record has no {', '.join(map(repr, missing))} (code_tests needs prompt, test, "
                              "entry_point)")

        pool = shared_pool(self.sandbox_profile)
        token = secrets.token_hex(16)
        partial = "1" if self.params.get("partial", False) else "0"
        files = {"solution.py": f"{record['prompt']}{completion}\n",
                 "tests.py": f"{_prelude(record['prompt'])}\n\n{record['test']}\n",
                 HARNESS_FILE: HARNESS}
        kwargs = dict(files=files, limits=_limits(pool, self.params), stdin=f"{token}\n".encode())
        return pool, token, ["python3", "-I", HARNESS_FILE, str(record["entry_point"]), partial], kwargs

    def _verdict(self, result, token: str) -> Verdict | None:
        # a run that killed its own box's fork server (SERVER_ENDED) did it itself: judged below, 0
        if result.verdict in ("error", "not_started") and SERVER_ENDED not in result.stderr:
            log.warning("code_tests: sandbox failed: %s", result.stderr[-300:])
            # the sandbox's fault, not the completion's: not judged
            return not_judged(f"sandbox failed: {result.stderr.strip()[-200:]}")
        details = {"verdict": result.verdict, "exit_code": result.exit_code, "wall_s": result.wall_s,
                   "stderr": result.stderr[-500:]}
        tally = _tally(result.stdout, token) if result.verdict == "ok" and result.exit_code == 0 else None
        if tally is None:
            return Verdict(0.0, {**details, "passed": 0})
        ok, passed, total = tally
        if ok:
            reward = 1.0
        elif self.params.get("partial", False) and total:
            reward = passed / total
        else:
            reward = 0.0
        return Verdict(reward, {**details, "all_passed": bool(ok), "passed": passed, "counted": total})

    def _prepare(self, record: dict[str, Any], completion: str):
        job = self._job(record, completion)
        if job is None:
            return None, None  # the record does not apply
        if (bad := self.screen(record, completion)) is not None:
            return bad, None
        pool, token, argv, kwargs = job
        return None, (pool, argv, kwargs, token)


def _lines(text: str, ordered: bool) -> list[str]:
    lines = [ln.rstrip() for ln in text.strip().splitlines()]
    return lines if ordered else sorted(lines)


class TerminalVerifier(Verifier):
    """params: timeout_s (per script), mode ('check' | 'output'), ordered (output mode: line order
    matters; default false), queue_timeout_s."""

    family = "terminal"
    known_params = {"timeout_s": PositiveFloat, "memory_mb": PositiveInt, "mode": Literal["check", "output"],
                    "ordered": bool, "queue_timeout_s": PositiveFloat}
    sandbox_profile = "shell"
    offload = True  # a session of several sandboxed commands, waited on in a worker thread

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        mode = self.params.get("mode", "check")
        needed = ("setup", "reference") if mode == "output" else ("setup", "check")
        if record.get(needed[1]) in (None, "") or record.get("setup") is None:
            return not_judged(f"record has no {needed[0]!r} and {needed[1]!r} (terminal, mode {mode})")
        if (bad := self.screen(record, completion)) is not None:
            return bad

        pool = shared_pool(self.sandbox_profile)
        limits = _limits(pool, self.params)
        try:
            box = pool.acquire(timeout=float(self.params.get("queue_timeout_s", 4 * limits.wall_s)))
        except QueueTimeout as e:
            log.warning("terminal: %s", e)
            return not_judged(f"sandbox overloaded: {e}")
        try:
            session = Session(box, limits)
            setup = session.run(record["setup"])
            if not setup.ok:  # the task is broken, not the completion
                return not_judged(f"the record's setup failed ({setup.verdict}, exit {setup.exit_code})")
            if mode == "output":
                return self._compare_outputs(session, record["reference"], completion)
            commands = session.run(completion)
            check = Session(box, limits).run(record["check"])
        finally:
            pool.release(box)
        return Verdict(1.0 if check.ok else 0.0, {
            "commands_verdict": commands.verdict, "commands_exit": commands.exit_code,
            "check_verdict": check.verdict, "check_exit": check.exit_code, "output": commands.stdout[-500:],
        })

    def _compare_outputs(self, session, reference: str, completion: str) -> Verdict | None:
        after_setup = session.snapshot()
        ref = session.run(reference)
        if not ref.ok or not ref.stdout.strip():
            return not_judged(f"the record's reference {'printed nothing' if ref.ok else 'failed'}")  # a reference that fails or prints nothing cannot tell a right answer from doing nothing
        session.restore(after_setup)
        got = session.run(completion)
        ordered = bool(self.params.get("ordered", False))
        same = got.verdict == "ok" and _lines(got.stdout, ordered) == _lines(ref.stdout, ordered)
        return Verdict(1.0 if same else 0.0, {"commands_verdict": got.verdict, "commands_exit": got.exit_code,
                                              "output": got.stdout[-500:], "expected": ref.stdout[-500:]})

