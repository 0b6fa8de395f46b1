"""The contract every verifier family implements.

A verifier is a plain class configured once from a domain's ``verifier.params`` and then
asked to score many (record, completion) pairs. It returns ``None`` when the record is
not something it can judge (so a mixed batch never gets a fake 0), otherwise a
``Verdict`` whose reward lies in [0, 1].
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Verdict:
    reward: float
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {self.reward}")


class Verifier:
    """Base class. Subclasses set ``family`` and implement ``score``.

    ``ascore`` runs ``score`` in a worker thread so many records verify concurrently;
    sandbox-backed families override it with a native async path.
    """

    family: ClassVar[str]
    #: Sandbox profile this family needs ('none' = runs in process).
    sandbox_profile: ClassVar[str] = "none"

    def __init__(self, **params: Any) -> None:
        self.params = params

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        raise NotImplementedError

    async def ascore(self, record: dict[str, Any], completion: str) -> Verdict | None:
        return await asyncio.to_thread(self.score, record, completion)
