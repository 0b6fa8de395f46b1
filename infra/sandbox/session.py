"""A stateful sandbox session: one box held across steps, for agents and terminal tasks.

Each step is a fresh sandboxed bash (own limits, nothing left running), yet the session feels
like one shell: the work dir persists, and so do the working directory and exported variables,
which every step prints after a random marker and the next step re-declares. A command that
calls ``exit`` or is killed leaves the shell state as it was. Every action and its observation
is recorded, so an episode can be saved, restored from a snapshot and replayed to check that it
reproduces.
"""

from __future__ import annotations

import base64
import json
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.sandbox.api import Box, Limits, Result

# Variables bash sets itself; re-declaring them would be wrong or fail.
_SKIP_VARS = ("PWD", "OLDPWD", "SHLVL", "_")


@dataclass
class ShellState:
    cwd: str = "/work"
    exports: str = ""  # `declare -x` lines, re-evaluable by bash


@dataclass
class Snapshot:
    archive: bytes
    shell: ShellState


@dataclass
class Step:
    action: dict[str, Any]
    observation: dict[str, Any]


@dataclass
class Session:
    """Wraps a leased box. ``limits`` are per step (wall, CPU, memory ... of each command).

    ``record``: keep every step's action and whole observation in ``steps`` (for ``save``/``replay``).
    An agent episode passes False: it keeps its own trajectory with observations cut to the domain's
    size, and a recorded step holds up to ``Limits.output_bytes`` of output, so the memory grows with the
    episode (measured: +87 MB over 500 turns, a turn in five printing 900 KB; 500 MB at the cap).
    """

    box: Box
    limits: Limits
    shell: ShellState = field(default_factory=ShellState)
    steps: list[Step] = field(default_factory=list)
    record: bool = True

    def run(self, command: str, timeout: float | None = None, stdin: bytes | None = None) -> Result:
        """Run a bash command string in the session's shell state; record it."""
        limits = self.limits.merged(wall_s=timeout)
        marker = f"__temper_state_{secrets.token_hex(8)}__"
        skip = "|".join(_SKIP_VARS)
        script = (
            f"{self.shell.exports}\ncd {shlex.quote(self.shell.cwd)} 2>/dev/null\n"
            f"{command}\n__temper_rc=$?\n"
            f"printf '\\n%s\\n' {marker}\n"
            f"for __v in $(compgen -e); do case $__v in {skip}) ;; *) declare -p \"$__v\";; esac; done\n"
            "pwd\nexit $__temper_rc\n"
        )
        raw = self.box.run(["bash", "-c", script], limits, stdin=stdin)
        out, sep, state = raw.stdout.rpartition(f"\n{marker}\n")
        if sep:
            lines = state.rstrip("\n").split("\n")
            self.shell = ShellState(cwd=lines[-1], exports="\n".join(lines[:-1]))
            raw = raw.model_copy(update={"stdout": out})
        self._record({"kind": "run", "command": command, "timeout": timeout}, raw)
        return raw

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        self.box.write_files(files)
        if self.record:
            enc = {k: base64.b64encode(v.encode() if isinstance(v, str) else v).decode() for k, v in files.items()}
            self.steps.append(Step({"kind": "write", "files_b64": enc}, {}))

    def read_file(self, path: str) -> bytes:
        return self.box.read_file(path)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.box.snapshot(), ShellState(self.shell.cwd, self.shell.exports))

    def restore(self, snap: Snapshot) -> None:
        self.box.restore(snap.archive)
        self.shell = ShellState(snap.shell.cwd, snap.shell.exports)
        if self.record:
            self.steps.append(Step({"kind": "restore"}, {}))

    def _record(self, action: dict[str, Any], result: Result) -> None:
        if self.record:
            self.steps.append(Step(action, result.model_dump(include={"stdout", "stderr", "exit_code", "verdict"})))

    # -- record / replay -----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """The recorded steps as JSONL: one {action, observation} per line."""
        with open(path, "w") as f:
            for s in self.steps:
                f.write(json.dumps({"action": s.action, "observation": s.observation}) + "\n")


def load_steps(path: str | Path) -> list[Step]:
    steps = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
                steps.append(Step(row["action"], row["observation"]))
            except (ValueError, KeyError) as e:
                raise ValueError(f"{path}:{n}: not a recorded step ({e})") from None
    return steps


def replay(session: Session, steps: list[Step], compare: tuple[str, ...] = ("stdout", "exit_code", "verdict")) -> list[dict]:
    """Re-run recorded actions in a fresh session; the mismatching observations (empty = reproduced).

    'restore' steps cannot be replayed without their snapshot and are reported as mismatches.
    """
    diffs = []
    for i, step in enumerate(steps):
        kind = step.action.get("kind")
        if kind == "write":
            session.write_files({k: base64.b64decode(v) for k, v in step.action["files_b64"].items()})
        elif kind == "run":
            got = session.run(step.action["command"], timeout=step.action.get("timeout")).model_dump()
            bad = {k: {"recorded": step.observation.get(k), "replayed": got[k]} for k in compare
                   if step.observation.get(k) != got[k]}
            if bad:
                diffs.append({"step": i, "command": step.action["command"], **bad})
        else:
            diffs.append({"step": i, "action": kind, "reason": "cannot replay this action"})
    return diffs
