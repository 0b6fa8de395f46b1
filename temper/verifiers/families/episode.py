"""Multi-step domains: the reward is the end state an episode leaves in its environment.

A multi-step domain names its environment (``env: files | ledger``) and its episode limits in its
verifier params. In GRPO each sample is a whole episode (``temper.training.multiturn``) and the
environment itself scores the end state (``EpisodeEnvironment.get_reward``), and eval plays episodes
the same way (``temper.agent.greedy_episodes``). This family is the same check for a single
completion (a one-shot plan, an SFT reference, a caller that has only text): every action tag of
the completion is played as one turn of a fresh episode, which is then scored like any other, so a
completion that never says ``<done/>``, or reaches a wrong state, scores 0.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import PositiveFloat, PositiveInt

from temper.agent.environment import EpisodeLimits, action_texts, play
from temper.agent.kinds import ENVIRONMENTS, make_environment
from temper.verifiers.base import Verdict, Verifier, not_judged


def episode_limits(params: dict[str, Any]) -> EpisodeLimits:
    known = EpisodeLimits()
    return EpisodeLimits(max_turns=int(params.get("max_turns", known.max_turns)),
                         budget_s=float(params.get("budget_s", known.budget_s)),
                         step_timeout_s=float(params.get("step_timeout_s", known.step_timeout_s)),
                         max_observation_chars=int(params.get("max_observation_chars", known.max_observation_chars)),
                         history_chars=int(params.get("history_chars", known.history_chars)))


class EpisodeVerifier(Verifier):
    """params: env (a kind of ``temper.agent.kinds.ENVIRONMENTS``), max_turns, budget_s (wall clock per episode), step_timeout_s,
    max_observation_chars (observation shown to the model), history_chars (observation characters the
    whole episode shows; past them each observation is its summary line, see ``EpisodeLimits``),
    turn_tokens (new tokens per model turn in GRPO, default 64)."""

    family = "episode"
    known_params = {"env": Literal[tuple(sorted(ENVIRONMENTS))], "max_turns": PositiveInt, "budget_s": PositiveFloat,
                    "step_timeout_s": PositiveFloat, "max_observation_chars": PositiveInt,
                    "turn_tokens": PositiveInt, "history_chars": PositiveInt}
    offload = True  # a files episode waits on sandbox commands

    def environment(self, **kwargs: Any):
        """A fresh environment of this domain's kind and limits (kwargs: e.g. the files env's ``pool``)."""
        return make_environment(self.params.get("env", "files"), episode_limits(self.params), **kwargs)

    def reference_completion(self, record: dict[str, Any]) -> str:
        """A multi-step dataset's ``reference`` is a JSON list of turns, each one action tag (the
        generators' scripted policy): played as one transcript, turn by turn as ``score`` cuts it."""
        reference = super().reference_completion(record)
        try:
            turns = json.loads(reference)
        except ValueError:
            raise ValueError("'reference' is not JSON (a multi-step reference is a JSON list of turns)") from None
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)):
            raise ValueError("'reference' is not a non-empty JSON list of turn strings")
        transcript = "\n".join(turns)
        if action_texts(transcript) != [t.strip() for t in turns]:
            raise ValueError("'reference' has a turn that is not exactly one action tag")
        return transcript

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        if not record.get("instruction"):
            return not_judged("record has no 'instruction' (episode)")
        if (bad := self.screen(record, completion)) is not None:
            return bad
        env = self.environment()
        turns = action_texts(completion)
        try:
            reward = play(env, record, turns or [completion])
        finally:
            env.close()
        details = {"outcome": env.outcome, "turns": env.turns, "wall_s": round(env.wall_s, 3)}
        if env.reason:
            details["reason"] = env.reason
        return Verdict(reward, details)
