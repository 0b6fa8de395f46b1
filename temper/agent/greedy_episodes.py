"""Eval episodes of a multi-step domain: the model plays the episode turn by turn, as in training.

Training (``temper.training.multiturn``) samples each turn from the policy, carries it out in the
domain's environment, lays the observation after it (``observation_block``) and asks for the next
turn, until the environment ends the episode; the reward is the environment's end-state check.
Eval does the same with greedy turns from the model under eval: ``generate(contexts, max_new_tokens)``
is the eval job's generator (transformers or the rollout backend), called once per round for every
episode still running, so a task that needs the observation of one step to choose the next is
scored on what the model does with it, not on one completion's action tags replayed blind.

Everything that ends an episode is the environment's, so eval counts the same outcomes as
training (``no_action``, ``timeout``, ``sandbox_error``, ``max_turns``, ``budget`` ...); a prompt the
generator cannot fit gets "" and ends as ``no_action``. Each episode comes back as a trajectory
line (``temper.agent.trajectories``), the same format training records and ``temper replay`` reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temper.agent import trajectories
from temper.agent.environment import EpisodeEnvironment, observation_block

log = logging.getLogger(__name__)

Generate = Callable[[list[str], int], list[str]]


def _each(fn, items: list) -> list:
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(16, len(items)), thread_name_prefix="eval-episode") as pool:
        return list(pool.map(fn, items))


def _start(item: tuple[EpisodeEnvironment, dict[str, Any]]) -> None:
    env, record = item
    try:
        env.reset(**record)
    except Exception as e:  # no box in time, setup failed: this episode fails, the eval goes on
        log.warning("eval episode could not start: %s", e)
        env.outcome = "sandbox_error"


def play_episodes(make_env: Callable[[], EpisodeEnvironment], env_kind: str, domain: str,
                  records: list[dict[str, Any]], prompts: list[str], generate: Generate, turn_tokens: int,
                  wave: int = 64, **extra: Any) -> list[dict[str, Any]]:
    """One episode per record, ``wave`` at a time (a sandboxed domain: as many as its pool has boxes);
    each episode's trajectory line, in order, with ``id`` and ``extra`` fields added."""
    out: list[dict[str, Any]] = []
    for lo in range(0, len(records), max(1, wave)):
        part, texts = records[lo:lo + wave], prompts[lo:lo + wave]
        envs = [make_env() for _ in part]
        try:
            _each(_start, list(zip(envs, part)))
            contexts = list(texts)
            while active := [i for i, env in enumerate(envs) if not env.finished]:
                turns = generate([contexts[i] for i in active], turn_tokens)
                observations = _each(lambda it: envs[it[0]].step(it[1]), list(zip(active, turns)))
                for i, turn, observation in zip(active, turns, observations):
                    contexts[i] += turn + ("" if envs[i].finished else observation_block(observation))
            rewards = _each(lambda env: env.get_reward(), envs)  # end-state checks; boxes go back
        finally:
            for env in envs:
                env.close()
        for env, record, reward in zip(envs, part, rewards):
            out.append(trajectories.trajectory(env_kind, env.limits, record, env, reward, domain,
                                               id=str(record.get("id", "")), **extra))
    return out
