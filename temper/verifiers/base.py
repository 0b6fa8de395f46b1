"""The contract every verifier family implements.

A verifier is a plain class configured once from a domain's ``verifier.params`` and then
asked to score many (record, completion) pairs. It returns ``None`` when the record is
not something it can judge (so a mixed batch never gets a fake 0), otherwise a
``Verdict`` whose reward lies in [0, 1].

A family returns that None as ``not_judged(reason)``: training only needs the None, but a person
running ``temper verify`` on a file where nothing was judged needs the why (a record without
``answer``), so the reason goes to whoever listens through ``not_judged_reasons``. A context
variable rather than a richer return type: every caller that tests ``verdict is None`` keeps working.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from difflib import get_close_matches
from functools import lru_cache
from typing import Any, ClassVar

from pydantic import PositiveInt, TypeAdapter, ValidationError
from typing_extensions import TypedDict


@dataclass(frozen=True)
class Verdict:
    reward: float
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {self.reward}")


_WHY_NOT: ContextVar[list[str] | None] = ContextVar("temper_not_judged", default=None)


def not_judged(reason: str) -> None:
    """What ``score`` returns for a record it cannot judge: None, with ``reason`` kept for a listener."""
    sink = _WHY_NOT.get()
    if sink is not None:
        sink.append(reason)
    return None


@contextmanager
def not_judged_reasons() -> Iterator[list[str]]:
    """Collect the ``not_judged`` reasons given while scoring inside the block (worker threads of
    ``asyncio.to_thread`` included: they run in a copy of this context, which shares the list)."""
    sink: list[str] = []
    token = _WHY_NOT.set(sink)
    try:
        yield sink
    finally:
        _WHY_NOT.reset(token)


#: Params that ``screen`` and ``without_inputs`` read for every family, with their types.
COMMON_PARAMS: dict[str, Any] = {"max_completion_chars": PositiveInt, "input_fields": list[str]}


@lru_cache(maxsize=None)
def _params_adapter(cls: type) -> TypeAdapter:
    # a TypedDict, not a model: params keep their names (a model field "schema" would shadow BaseModel.schema)
    return TypeAdapter(TypedDict(f"{cls.family}_params", {**COMMON_PARAMS, **cls.known_params}, total=False))


def check_params(cls: type, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` typed against what ``cls`` reads: an unknown name (with its close match) or a value of
    the wrong type raises ValueError naming the family and the param; values come back coerced."""
    known = sorted({**COMMON_PARAMS, **cls.known_params})
    unknown = sorted(set(params) - set(known))
    if unknown:
        hints = [f"{u!r}" + (f" (did you mean {close[0]!r}?)" if (close := get_close_matches(u, known, 1)) else "")
                 for u in unknown]
        raise ValueError(f"{cls.family} verifier: unknown param(s) {', '.join(hints)}; known: {', '.join(known)}")
    try:
        return _params_adapter(cls).validate_python(params)
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"{cls.family} verifier: param '{'.'.join(map(str, first['loc']))}': {first['msg']}, "
                         f"got {first['input']!r}") from None


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
    #: Record columns the prompt shows the model. A verbatim copy of one of them in the completion
    #: is not an answer: extraction families look for the answer in what is left without them.
    input_fields: ClassVar[tuple[str, ...]] = ()
    #: Completions longer than this score 0 (params.max_completion_chars overrides it).
    max_completion_chars: ClassVar[int] = 32_768
    #: The params this family reads and their types, besides the ones every family reads
    #: (``COMMON_PARAMS``). Anything else is refused when the verifier is built: a typo such as
    #: ``tolerence`` would otherwise be ignored and the domain would train with the default, and
    #: ``tolerance: "abc"`` would only fail at the first completion. None: the family types its params
    #: itself (judge's, temper.judges.params.JudgeVerifierParams).
    known_params: ClassVar[dict[str, Any] | None] = {}

    def __init__(self, **params: Any) -> None:
        self.params = check_params(type(self), params) if self.known_params is not None else params

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        raise NotImplementedError

    def reference_completion(self, record: dict[str, Any]) -> str:
        """The record's gold ``reference`` as the completion this family scores (``temper verify
        --reference``, the check that a dataset and its verifier agree). Most datasets store it as
        that text already; a family whose datasets store it otherwise decodes it here. ValueError
        (naming what is wrong) when the record has none this family can use."""
        reference = record.get("reference")
        if not isinstance(reference, str):
            raise ValueError("no string field 'reference'")
        return reference

    def screen(self, record: dict[str, Any], completion: Any) -> Verdict | None:
        """Verdict 0 for a degenerate completion (not a string, empty, huge, nothing but the prompt's
        own inputs); None when the family should go on and judge it. Every family calls this once
        it knows the record is one it judges, so do-nothing outputs earn nothing in any family."""
        if not isinstance(completion, str) or not completion.strip():
            return Verdict(0.0, {"reason": "empty completion"})
        limit = int(self.params.get("max_completion_chars", self.max_completion_chars))
        if len(completion) > limit:
            return Verdict(0.0, {"reason": f"completion longer than {limit} characters"})
        if self.input_fields and not self.without_inputs(record, completion).strip():
            return Verdict(0.0, {"reason": "completion only repeats the prompt's inputs"})
        return None

    def without_inputs(self, record: dict[str, Any], completion: str) -> str:
        """``completion`` with every verbatim copy (whitespace aside) of the record's input columns cut out."""
        fields = self.params.get("input_fields", self.input_fields)
        for name in fields:
            value = record.get(name)
            if isinstance(value, str) and len(value.strip()) >= 2:
                pattern = r"\s*".join(re.escape(tok) for tok in value.split())
                completion = re.sub(pattern, " ", completion)
        return completion

    async def ascore(self, record: dict[str, Any], completion: str) -> Verdict | None:
        if self.offload:
            return await asyncio.to_thread(self.score, record, completion)
        return self.score(record, completion)
