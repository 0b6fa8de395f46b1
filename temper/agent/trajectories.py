"""Episodes of multi-step domains as trajectories (plain JSONL), and their replay.

One line per episode, a JSON object readable as it is::

    {"format": "temper.trajectory/1", "domain": "ledger_tasks", "env": "ledger",
     "limits": {"max_turns": 8, "budget_s": 30.0, ...}, "record": {...the dataset record...},
     "turns": [{"turn": 1, "action": "<call>...</call>", "observation": "{...}", "t": 0.002}, ...,
               {"turn": 3, "action": "<done/>", "observation": "", "t": 0.004, "outcome": "done"}],
     "outcome": "done", "reward": 1.0, "wall_s": 0.01, "step": 3, "rank": 0}

``turns[i].t`` is the time since the episode started when the turn's observation came back;
``step``/``rank`` say which GRPO step and rank sampled it (training writes
``<output_dir>/trajectories/rank<k>.jsonl``, see ``temper.training.multiturn``).

``replay`` re-executes the recorded actions in a fresh environment of the same kind and limits
(a fresh sandbox box for ``files``), with the same record as the start state, and re-verifies
the end state: an episode is *equal* when every turn's observation and ending, the episode's
outcome and its reward come out the same (timings are not compared). ``temper replay`` is the
command. Outcomes the environment cannot reproduce from actions alone (``max_tokens``: the
trainer's token budget; ``budget``: wall-clock) are replayed to the same turns and only the turns
and reward are compared.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from temper.agent.environment import EpisodeEnvironment, EpisodeLimits, play
from temper.agent.kinds import ENVIRONMENTS, make_environment
from temper.core.errors import TemperError
from temper.core.jsonl import json_objects

FORMAT = "temper.trajectory/1"
REQUIRED = {"format": str, "env": str, "limits": dict, "record": dict, "turns": list, "outcome": str}
EXTERNAL_ENDINGS = ("max_tokens", "budget")  # imposed from outside the environment's actions


class TrajectoryError(TemperError):
    """A trajectory file is unreadable or not in the trajectory format."""


def trajectory(env_kind: str, limits: EpisodeLimits, record: dict[str, Any], env: EpisodeEnvironment,
               reward: float | None, domain: str = "", **extra: Any) -> dict[str, Any]:
    """The trajectory line of a finished episode of ``env`` (its turns, outcome and timing)."""
    return {"format": FORMAT, "domain": domain, "env": env_kind, "limits": asdict(limits), "record": record,
            "turns": [dict(t) for t in env.trajectory], "outcome": env.outcome, "reward": reward,
            "wall_s": round(env.wall_s, 3), **extra}


def record_episode(env_kind: str, record: dict[str, Any], turns: list[str], limits: EpisodeLimits | None = None,
                   domain: str = "", **env_kwargs: Any) -> dict[str, Any]:
    """Play scripted model turns (a reference policy, a test) in a fresh environment; its trajectory."""
    limits = limits or EpisodeLimits()
    env = make_environment(env_kind, limits, **env_kwargs)
    try:
        reward = play(env, record, turns)
    finally:
        env.close()
    return trajectory(env_kind, limits, record, env, reward, domain)


def write(path: str | Path, trajectories: list[dict[str, Any]], append: bool = True) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w") as f:
        for t in trajectories:
            f.write(json.dumps(t, default=str) + "\n")


def read(path: str | Path) -> list[dict[str, Any]]:
    """Every episode of a trajectory file, checked; a bad file is one ``TrajectoryError`` line naming
    the file, the line and the problem."""
    path = Path(path)
    out = []
    for n, row in json_objects(path, TrajectoryError, "a JSON object (one episode)"):
        for key, kind in REQUIRED.items():
            if not isinstance(row.get(key), kind):
                got = "missing" if key not in row else type(row[key]).__name__
                raise TrajectoryError(f"{path}:{n}: field {key!r} must be a {kind.__name__}, got {got}")
        if row["format"] != FORMAT:
            raise TrajectoryError(f"{path}:{n}: format {row['format']!r} is not {FORMAT!r}")
        if row["env"] not in ENVIRONMENTS:
            raise TrajectoryError(f"{path}:{n}: unknown env {row['env']!r} (known: {', '.join(sorted(ENVIRONMENTS))})")
        try:
            row["_limits"] = EpisodeLimits(**row["limits"])
        except TypeError as e:
            raise TrajectoryError(f"{path}:{n}: field 'limits': {e}") from None
        for i, turn in enumerate(row["turns"]):
            if not (isinstance(turn, dict) and isinstance(turn.get("action"), str)
                    and isinstance(turn.get("observation"), str)):
                raise TrajectoryError(f"{path}:{n}: turns[{i}] needs string fields 'action' and 'observation'")
        out.append(row)
    if not out:
        raise TrajectoryError(f"{path}: no episodes (empty file)")
    return out


def read_new(path: str | Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole lines appended to a trajectory file since byte ``offset`` (a writer's half-written last
    line is left for the next call), and the offset to continue from; ([], offset) when there is no file.
    A line that is not a JSON object (a write cut short by a full disk) is skipped: sampling episodes for
    a look must never stop a training step."""
    path = Path(path)
    if not path.exists():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    complete = data[: data.rfind(b"\n") + 1]
    out = []
    for line in complete.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("turns"), list) and "outcome" in row:
            out.append(row)
    return out, offset + len(complete)


def drop_from_step(path: str | Path, step: int) -> int:
    """Drop from a training trajectory file the lines of steps ``>= step`` and any line cut short: what a
    run killed in the middle of a step wrote for steps its last checkpoint does not hold, which the resumed
    run samples again (its first rollout calls this with the step it resumes at). The number dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            row = json.loads(line)
            keep = line.endswith(b"\n") and isinstance(row, dict) and isinstance(row.get("step"), int) \
                and row["step"] < step
        except ValueError:
            keep = False
        if keep:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    return dropped


def first_per_domain(lines: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The first ``k`` episodes of each domain, in order: the few a logging window shows."""
    seen: dict[str, int] = {}
    out = []
    for t in lines:
        seen[t.get("domain", "")] = n = seen.get(t.get("domain", ""), 0) + 1
        if n <= k:
            out.append(t)
    return out


def markdown(t: dict[str, Any], max_chars: int = 600) -> str:
    """One episode as a page a person reads: the task, each turn's action, observation (cut to
    ``max_chars``) and time, the outcome and the reward."""
    head = [f"# {t.get('domain') or t['env']} episode: {t['outcome']}, reward {t.get('reward')}", ""]
    where = ", ".join(f"{k} {t[k]}" for k in ("step", "rank", "label", "id") if t.get(k) is not None)
    head += [f"env `{t['env']}`, {len(t['turns'])} turn(s), {t.get('wall_s', '?')} s" + (f"; {where}" if where else ""),
             "", "## Task", "", "```", str(t["record"].get("instruction", ""))[:max_chars], "```"]
    for turn in t["turns"]:
        head += ["", f"## Turn {turn.get('turn', '?')} (t = {turn.get('t', '?')} s)"
                 + (f", ended: {turn['outcome']}" if turn.get("outcome") else ""),
                 "", "Action:", "```", turn["action"][:max_chars], "```"]
        if turn["observation"]:
            obs = turn["observation"]
            cut = f"\n[... {len(obs) - max_chars} more chars]" if len(obs) > max_chars else ""
            head += ["Observation:", "```", obs[:max_chars] + cut, "```"]
    return "\n".join(head) + "\n"


def artifact_name(t: dict[str, Any], i: int) -> str:
    """A stable, readable file name for episode ``i`` of a sample (``<domain>-<i>-<outcome>.md``)."""
    return f"{t.get('domain') or t['env']}-{i:02d}-{t['outcome']}.md"


@dataclass
class ReplayResult:
    domain: str
    equal: bool
    reward: float | None
    outcome: str
    differences: list[str] = field(default_factory=list)


def _short(text: str, limit: int = 120) -> str:
    text = json.dumps(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def replay(recorded: dict[str, Any], **env_kwargs: Any) -> ReplayResult:
    """Re-execute a recorded episode's actions in a fresh environment and compare (see the module doc)."""
    limits = recorded.get("_limits") or EpisodeLimits(**recorded["limits"])
    actions = [t["action"] for t in recorded["turns"]]
    again = record_episode(recorded["env"], recorded["record"], actions, limits, recorded.get("domain", ""),
                           **env_kwargs)
    diffs = []
    before, after = recorded["turns"], again["turns"]
    if len(before) != len(after):
        diffs.append(f"turns: recorded {len(before)}, replayed {len(after)}")
    for a, b in zip(before, after):
        if a["observation"] != b["observation"]:
            diffs.append(f"turn {a.get('turn', '?')} observation: recorded {_short(a['observation'])}, "
                         f"replayed {_short(b['observation'])}")
        if a.get("outcome") != b.get("outcome"):
            diffs.append(f"turn {a.get('turn', '?')} ending: recorded {a.get('outcome')}, replayed {b.get('outcome')}")
    if recorded["outcome"] not in EXTERNAL_ENDINGS and recorded["outcome"] != again["outcome"]:
        diffs.append(f"outcome: recorded {recorded['outcome']}, replayed {again['outcome']}")
    if recorded.get("reward") != again["reward"]:
        diffs.append(f"reward: recorded {recorded.get('reward')}, replayed {again['reward']}")
    return ReplayResult(recorded.get("domain", ""), not diffs, again["reward"], again["outcome"], diffs)
