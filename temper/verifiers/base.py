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

    ``ascore`` is what batch scoring awaits (``asyncio.gather`` over a batch). A family whose
    ``score`` waits on something (a model endpoint) sets ``offload`` so ``score`` runs in a worker
    thread and the batch overlaps; sandbox-backed families override ``ascore`` with a native async
    path. Pure in-process checks run inline: a thread cannot speed up GIL-bound Python, and
    handing each of a GRPO step's samples to one cost ~3 ms a step, 9% of a tiny-model step.
    """

    family: ClassVar[str]
    #: Sandbox profile this family needs ('none' = runs in process).
    sandbox_profile: ClassVar[str] = "none"
    #: ``score`` blocks on I/O: run it in a worker thread so a batch's calls overlap.
    offload: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        self.params = params

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        raise NotImplementedError

    async def ascore(self, record: dict[str, Any], completion: str) -> Verdict | None:
        if self.offload:
            return await asyncio.to_thread(self.score, record, completion)
        return self.score(record, completion)
