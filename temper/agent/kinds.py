"""The environment kinds a multi-step domain may name (its verifier param ``env``), registered here.

One table, so the episode verifier, eval, GRPO rollouts and ``temper replay`` make an environment
the same way from the same name.
"""

from __future__ import annotations

from typing import Any

from temper.agent.environment import EpisodeEnvironment, EpisodeLimits
from temper.agent.files import FilesEnvironment
from temper.agent.ledger import LedgerEnvironment
from temper.agent.repair import RepairEnvironment

ENVIRONMENTS: dict[str, type[EpisodeEnvironment]] = {"files": FilesEnvironment, "ledger": LedgerEnvironment,
                                                     "repair": RepairEnvironment}


def make_environment(kind: str, limits: EpisodeLimits | None = None, **kwargs: Any) -> EpisodeEnvironment:
    try:
        cls = ENVIRONMENTS[kind]
    except KeyError:
        raise ValueError(f"unknown environment {kind!r}; known: {', '.join(sorted(ENVIRONMENTS))}") from None
    return cls(limits, **kwargs)
