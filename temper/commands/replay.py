"""`temper replay TRAJECTORY.jsonl`: re-execute recorded episodes in fresh environments and re-verify.

Each episode of the file (the trajectory format of ``temper.agent.trajectories``: training writes
``<output_dir>/trajectories/rank<k>.jsonl``) is played again from its record's start state with
its recorded actions, in a fresh sandbox box for file tasks. One JSON line per episode says
``equal`` or ``different`` (with each difference: a turn's observation or ending, the outcome,
the reward), then a summary line. Exit 0 when every episode is equal, 1 when any differs (or
the file is bad: one line on stderr).
"""

from __future__ import annotations

import json
from pathlib import Path


def replay(args) -> int:
    # lazy: temper.agent pulls in infra.sandbox (11 ms) at every `temper` start-up (--help loads all commands)
    from temper.agent import trajectories

    episodes = trajectories.read(args.trajectory)
    different = 0
    for i, recorded in enumerate(episodes):
        result = trajectories.replay(recorded)
        different += not result.equal
        print(json.dumps({"episode": i, "domain": result.domain, "result": "equal" if result.equal else "different",
                          "outcome": result.outcome, "reward": result.reward, "differences": result.differences}))
    print(json.dumps({"summary": {"episodes": len(episodes), "equal": len(episodes) - different,
                                  "different": different}}))
    return 1 if different else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("replay", help="re-execute recorded episodes (trajectory JSONL) and re-verify them")
    p.add_argument("trajectory", type=Path, metavar="TRAJECTORY.jsonl")
    p.set_defaults(func=replay)
