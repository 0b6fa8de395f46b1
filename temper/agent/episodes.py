"""Multi-step agent episodes in the sandbox: a policy issues shell commands, the env answers.

An episode: ``env.reset()`` builds the task (the record's setup in a fresh session) and returns
the instruction; then up to ``max_steps`` times the policy sees the last observation and the
history and returns a command (or ``None`` to stop); the env runs it and returns its output.
The episode ends on the policy's stop, ``max_steps`` or the ``budget`` (sandbox seconds summed
over steps); ``env.reward()`` then runs the record's check in a clean shell. Every episode can
be written as JSONL (header, one line per step, end) and replayed: the recorded actions are
re-run in a fresh env and observations and reward compared, which is how a saved trajectory is
shown to be reproducible (or a regression in the env found).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from infra.sandbox import Limits, SandboxPool, Session, shared_pool


@dataclass
class Turn:
    step: int
    action: str
    observation: str
    exit_code: int | None
    verdict: str
    wall_s: float


class Policy(Protocol):
    def __call__(self, observation: str, history: list[Turn]) -> str | None:
        """The next shell command, or None to finish."""


class ScriptedPolicy:
    """Plays a fixed list of commands (a recorded trajectory, a reference solution, a test)."""

    def __init__(self, actions: Iterable[str]) -> None:
        self.actions = list(actions)

    def __call__(self, observation: str, history: list[Turn]) -> str | None:
        return self.actions[len(history)] if len(history) < len(self.actions) else None


def format_observation(stdout: str, stderr: str, exit_code: int | None, verdict: str, limit: int) -> str:
    text = stdout + (("\n[stderr]\n" + stderr) if stderr else "")
    if len(text) > limit:
        text = text[: limit // 2] + f"\n[... {len(text) - limit} chars cut ...]\n" + text[-limit // 2:]
    status = f"[exit {exit_code}]" if verdict == "ok" else f"[{verdict}]"
    return f"{text.rstrip()}\n{status}".lstrip("\n")


class TerminalEnv:
    """A shell_tasks record (instruction, setup, check) as an environment over a leased sandbox box."""

    def __init__(self, record: dict[str, Any], pool: SandboxPool | None = None, step_timeout_s: float = 10.0,
                 max_observation_chars: int = 2000) -> None:
        missing = [k for k in ("instruction", "setup", "check") if k not in record]
        if missing:
            raise ValueError(f"record {record.get('id', '?')}: a terminal episode needs {missing}")
        self.record, self.pool = record, pool or shared_pool("shell")
        self.limits: Limits = self.pool.profile.limits.merged(wall_s=step_timeout_s)
        self.max_observation_chars = max_observation_chars
        self.session: Session | None = None

    def reset(self) -> str:
        self.close()
        self.session = Session(self.pool.acquire(timeout=60), self.limits)
        setup = self.session.run(self.record["setup"])
        if not setup.ok:
            raise RuntimeError(f"record {self.record.get('id', '?')}: setup failed ({setup.verdict}, "
                               f"exit {setup.exit_code}): {setup.stderr[-300:]}")
        return self.record["instruction"]

    def step(self, action: str) -> Turn:
        assert self.session is not None, "call reset() first"
        r = self.session.run(action)
        obs = format_observation(r.stdout, r.stderr, r.exit_code, r.verdict, self.max_observation_chars)
        return Turn(0, action, obs, r.exit_code, r.verdict, r.wall_s)

    def reward(self) -> float:
        assert self.session is not None, "call reset() first"
        return 1.0 if Session(self.session.box, self.limits).run(self.record["check"]).ok else 0.0

    def close(self) -> None:
        if self.session is not None:
            self.pool.release(self.session.box)
            self.session = None


@dataclass
class Episode:
    record_id: str
    instruction: str
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    stop_reason: str = ""  # policy | max_steps | budget

    def save(self, path: str | Path) -> None:
        with open(path, "w") as f:
            f.write(json.dumps({"type": "episode", "record_id": self.record_id, "instruction": self.instruction}) + "\n")
            for t in self.turns:
                f.write(json.dumps({"type": "step", **asdict(t)}) + "\n")
            f.write(json.dumps({"type": "end", "reward": self.reward, "stop_reason": self.stop_reason}) + "\n")


def load_episode(path: str | Path) -> Episode:
    ep: Episode | None = None
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        row = json.loads(line)
        kind = row.pop("type", None)
        if kind == "episode":
            ep = Episode(row["record_id"], row["instruction"])
        elif ep is None:
            raise ValueError(f"{path}:{n}: trajectory must start with an 'episode' header")
        elif kind == "step":
            ep.turns.append(Turn(**row))
        elif kind == "end":
            ep.reward, ep.stop_reason = row["reward"], row["stop_reason"]
        else:
            raise ValueError(f"{path}:{n}: unknown line type {kind!r}")
    if ep is None:
        raise ValueError(f"{path}: empty trajectory")
    return ep


def run_episode(policy: Policy | Callable[[str, list[Turn]], str | None], env: TerminalEnv, max_steps: int = 8,
                budget: float | None = None, trajectory: str | Path | None = None) -> Episode:
    """Play one episode; ``budget`` caps the summed sandbox wall time of the steps (seconds)."""
    observation = env.reset()
    ep = Episode(str(env.record.get("id", "")), observation)
    spent = 0.0
    try:
        while True:
            if len(ep.turns) >= max_steps:
                ep.stop_reason = "max_steps"
                break
            if budget is not None and spent >= budget:
                ep.stop_reason = "budget"
                break
            action = policy(observation, list(ep.turns))
            if action is None:
                ep.stop_reason = "policy"
                break
            turn = env.step(action)
            turn.step = len(ep.turns)
            ep.turns.append(turn)
            spent += turn.wall_s
            observation = turn.observation
        ep.reward = env.reward()
    finally:
        env.close()
    if trajectory is not None:
        ep.save(trajectory)
    return ep


def replay_episode(trajectory: str | Path | Episode, env: TerminalEnv) -> list[dict[str, Any]]:
    """Re-run a recorded episode's actions in ``env``; the differences (empty = it reproduces)."""
    recorded = trajectory if isinstance(trajectory, Episode) else load_episode(trajectory)
    again = run_episode(ScriptedPolicy(t.action for t in recorded.turns), env, max_steps=len(recorded.turns))
    diffs = [{"step": a.step, "action": a.action, "recorded": a.observation, "replayed": b.observation}
             for a, b in zip(recorded.turns, again.turns) if (a.observation, a.exit_code) != (b.observation, b.exit_code)]
    if again.reward != recorded.reward:
        diffs.append({"step": "end", "recorded_reward": recorded.reward, "replayed_reward": again.reward})
    return diffs
