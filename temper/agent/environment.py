"""Multi-turn environments: a task, a state the model changes turn by turn, a reward on the end state.

One episode: ``reset(**record)`` builds the task's starting state and returns the task text; each
model turn goes to ``step(text)``, which parses it into one action (a shell command, a file write,
a call of the environment's API, or "done"), carries it out and returns the observation; the
episode ends at "done", at the domain's turn limit or at its wall-clock budget, and ``get_reward``
then checks the end state. ``reset``/``get_reward`` are the names TRL's environments use.

Rewards cannot be had without doing the task: only an episode the model ends with "done" is
checked at all, and the check compares the *whole* end state with the record's expected one on
the host (the sandbox's files are read out as a tar archive, within ``END_STATE_LIMITS`` checked
before any file is read, so what a box holds cannot make the check costly; the API's state lives in
this process), so nothing the model prints or changes inside the box can stand in for the state.

Every way an episode can go wrong ends it with a counted outcome and reward 0, never an
exception out of ``step``: a turn that parses into no action (``no_action``; a ``<call>`` too long
or too deeply nested is refused before ``json.loads``, which would recurse), a command that hangs
(``timeout``), floods its output or memory (``output_limit``, ``memory``...), a sandbox that dies
(``sandbox_error``), too many turns (``max_turns``) or too much time (``budget``). Each episode
gets a freshly wiped box from the warm pool and gives it back wiped (``SandboxPool.release``), so
nothing one episode writes is seen by the next.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

log = logging.getLogger(__name__)

ActionKind = Literal["bash", "write", "call", "done"]
# An episode's end: "done" is the only one whose end state is checked.
Outcome = Literal["running", "done", "max_turns", "budget", "no_action", "timeout", "cpu_limit", "memory",
                  "output_limit", "killed", "sandbox_error", "max_tokens"]
FAILURE_OUTCOMES = ("max_turns", "budget", "no_action", "timeout", "cpu_limit", "memory", "output_limit",
                    "killed", "sandbox_error", "max_tokens")
ENDINGS = ("done", *FAILURE_OUTCOMES)  # every way a finished episode can end, each counted in the metrics

_TAG = re.compile(
    r"<bash>(?P<bash>.*?)</bash>"
    r"|<write\s+path=\"(?P<path>[^\"]*)\">(?P<content>.*?)</write>"
    r"|<call>(?P<call>.*?)</call>"
    r"|(?P<done><done\s*/>)",
    re.S,
)

ACTION_HELP = ("Act with exactly one of: <bash>COMMAND</bash>, <write path=\"FILE\">CONTENT</write>, "
               "<call>{\"name\": TOOL, \"arguments\": {...}}</call>, and <done/> when the task is finished.")


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    command: str = ""
    path: str = ""
    content: str = ""
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


# A call is data of depth 2 ({"name", "arguments": {...}}) and a few hundred characters; json.loads
# recurses once per nesting level, so 3000 brackets would raise RecursionError out of ``step``.
MAX_CALL_CHARS = 10_000
MAX_CALL_DEPTH = 16


def _nesting_over(text: str, limit: int) -> bool:
    """True when JSON ``text`` nests arrays/objects deeper than ``limit`` (brackets in strings aside)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _parse(m: re.Match) -> Action | str:
    """The action of one tag, or why it is malformed."""
    if m.group("done") is not None:
        return Action("done")
    if m.group("bash") is not None:
        return Action("bash", command=m.group("bash")) if m.group("bash").strip() else "empty <bash> command"
    if m.group("path") is not None:
        return Action("write", path=m.group("path"), content=m.group("content"))
    body = m.group("call")
    if len(body) > MAX_CALL_CHARS:  # bounded before parsing: json.loads is not
        return f"<call> longer than {MAX_CALL_CHARS} characters"
    if _nesting_over(body, MAX_CALL_DEPTH):
        return f"<call> nested deeper than {MAX_CALL_DEPTH} levels"
    try:
        call = json.loads(body)
    except ValueError as e:
        return f"<call> is not JSON ({e})"
    if not (isinstance(call, dict) and isinstance(call.get("name"), str)
            and isinstance(call.get("arguments", {}), dict)):
        return '<call> is not {"name": TOOL, "arguments": {...}}'
    return Action("call", name=call["name"], arguments=call.get("arguments", {}))


def _action(m: re.Match) -> Action | None:
    parsed = _parse(m)
    return parsed if isinstance(parsed, Action) else None


def parse_turn(text: str) -> tuple[Action | None, str]:
    """The first action of a model turn and "", or None and why the turn parses into no action."""
    for m in _TAG.finditer(text or ""):
        parsed = _parse(m)
        return (parsed, "") if isinstance(parsed, Action) else (None, parsed)
    return None, "no action tag"


def parse_action(text: str) -> Action | None:
    """The first well-formed action of a model turn, or None (the turn parses into no action)."""
    return parse_turn(text)[0]


def parse_actions(text: str) -> list[Action | None]:
    """Every action tag of a text in order (a whole transcript, or a one-shot plan); None for malformed ones."""
    return [_action(m) for m in _TAG.finditer(text or "")]


def action_texts(text: str) -> list[str]:
    """The text of every action tag in ``text``, in order: a transcript cut into turns."""
    return [m.group(0) for m in _TAG.finditer(text or "")]


def render_action(action: Action) -> str:
    """The text form the model writes (reference transcripts, SFT targets)."""
    if action.kind == "done":
        return "<done/>"
    if action.kind == "bash":
        return f"<bash>{action.command}</bash>"
    if action.kind == "write":
        return f"<write path=\"{action.path}\">{action.content}</write>"
    return f"<call>{json.dumps({'name': action.name, 'arguments': action.arguments}, sort_keys=True)}</call>"


@dataclass(frozen=True)
class EpisodeLimits:
    """A domain's episode limits (its verifier params): turns, wall-clock budget, per-step timeout,
    observation size shown to the model, and ``history_chars``: the observation characters the whole
    episode may show (0: no budget), the policy for a history that would outgrow the context.

    Why a budget and not "keep the last N observations": the model's context is laid end to end
    (training's completion, eval's text, the engine's KV cache), and cutting an *earlier* observation
    would rewrite tokens already in it, so the turn sampled after them would be trained on a context it
    never saw and the prefix cache would miss from the cut on. Instead observations are cut as they are
    made: in full (up to ``max_observation_chars``) while the budget lasts, then each one as its summary
    line (``summary_line``: its size and the start of its last line). The context only grows, by
    little, so a 500-turn episode fits; the loss masks and the cache are untouched; and because the
    environment makes the cut, training, eval and replay show the same text.
    """

    max_turns: int = 8
    budget_s: float = 60.0
    step_timeout_s: float = 10.0
    max_observation_chars: int = 1000
    history_chars: int = 0


def summary_line(observation: str) -> str:
    """An observation past the episode's budget: its size and the start of its last line (a command's
    ``[exit N]``, a call's result), or the observation itself where that is no longer."""
    line = f"[{len(observation)} chars cut] {observation.rstrip(chr(10)).rsplit(chr(10), 1)[-1][:60]}".rstrip()
    return line if len(line) < len(observation) else observation


def observation_block(observation: str) -> str:
    """An observation as the plain-text block that follows a model turn (training's plain prompts and
    eval's episodes lay turns and observations end to end the same way)."""
    return f"\nObservation:\n{observation}\nNext action:\n"


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"\n[... {len(text) - limit} chars cut ...]\n" + text[-(limit // 2):]


class EpisodeEnvironment:
    """Turn bookkeeping shared by every environment; subclasses implement ``_start``, ``_act``,
    ``_end_state_ok`` and ``_release``."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[ActionKind, ...]]
    # An episode holds a box of the "shell" pool from reset to get_reward: callers running episodes side
    # by side (GRPO's rollout, eval's waves) size that pool, or the wave, to the episodes they run.
    holds_box: ClassVar[bool] = False

    def __init__(self, limits: EpisodeLimits | None = None) -> None:
        self.limits = limits or EpisodeLimits()
        self.record: dict[str, Any] = {}
        self.outcome: Outcome = "running"
        self.reason = ""  # why the episode failed, when its outcome alone does not say (verify shows it)
        self.turns = 0
        self.shown = 0
        self.started = 0.0
        self.trajectory: list[dict[str, Any]] = []

    # -- TRL's environment interface -----------------------------------------------------------------
    def reset(self, **record: Any) -> str:
        """Start an episode of ``record``; the task text the model sees first."""
        self._release()
        self.record, self.outcome, self.turns, self.trajectory = record, "running", 0, []
        self.shown = 0  # observation characters shown so far (``EpisodeLimits.history_chars``)
        self.reason = ""
        self.started = time.monotonic()
        return self._start(record)

    def get_reward(self) -> float:
        """1.0 when the model ended the episode with "done" and the end state is the expected one."""
        try:
            if self.outcome != "done":
                return 0.0
            try:
                return 1.0 if self._end_state_ok() else 0.0
            except Exception as e:  # a box that died before the check: the episode failed, counted
                log.warning("%s: end-state check failed: %s", self.name, e)
                self.outcome = "sandbox_error"
                return 0.0
        finally:
            self._release()

    # -- turns ---------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.outcome != "running"

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def step(self, text: str) -> str:
        """Carry out one model turn; the observation (empty once the episode is over)."""
        if self.finished:
            return ""
        self.turns += 1
        action, self.reason = parse_turn(text)
        if action is None or action.kind not in self.kinds:
            if action is not None:
                self.reason = f"{action.kind} is not an action of the {self.name} environment"
            return self._end("no_action", text, "")
        if action.kind == "done":
            return self._end("done", text, "")
        remaining = self.limits.budget_s - self.wall_s
        if remaining <= 0:
            return self._end("budget", text, "")
        try:
            observation, failure = self._act(action, min(self.limits.step_timeout_s, remaining))
        except Exception as e:  # the sandbox itself failed (died, closed): not the model's crash to propagate
            log.warning("%s: sandbox failed during a step: %s", self.name, e)
            return self._end("sandbox_error", text, f"[sandbox error] {e}")
        observation = truncate(observation, self.limits.max_observation_chars)
        if self.limits.history_chars and self.shown + len(observation) > self.limits.history_chars:
            observation = summary_line(observation)
        self.shown += len(observation)
        if failure is not None:
            return self._end(failure, text, observation)
        self.trajectory.append({"turn": self.turns, "action": text, "observation": observation,
                                "t": round(self.wall_s, 3)})
        if self.turns >= self.limits.max_turns:
            self.outcome = "max_turns"
        elif self.wall_s >= self.limits.budget_s:
            self.outcome = "budget"
        return observation

    def _end(self, outcome: Outcome, text: str, observation: str) -> str:
        self.outcome = outcome
        self.trajectory.append({"turn": self.turns, "action": text, "observation": observation,
                                "t": round(self.wall_s, 3), "outcome": outcome})
        return observation

    def close(self) -> None:
        self._release()

    # -- subclass hooks ------------------------------------------------------------------------------
    def _start(self, record: dict[str, Any]) -> str:
        raise NotImplementedError

    def _act(self, action: Action, timeout_s: float) -> tuple[str, Outcome | None]:
        """(observation, None) or (observation, failure outcome that ends the episode)."""
        raise NotImplementedError

    def _end_state_ok(self) -> bool:
        raise NotImplementedError

    def _release(self) -> None:
        pass


def play(env: EpisodeEnvironment, record: dict[str, Any], turns: list[str]) -> float:
    """Run scripted model turns through one episode (reference and degenerate policies, replay);
    the reward. Turns past the episode's end are ignored."""
    env.reset(**record)
    for text in turns:
        if env.finished:
            break
        env.step(text)
    if not env.finished:
        env.outcome = "max_turns"  # the policy ran out of turns without saying done
    return env.get_reward()
