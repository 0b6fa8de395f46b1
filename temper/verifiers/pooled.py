"""Verifier families that run each completion as one program in the sandbox's warm pool.

A family says how a (record, completion) becomes a program (``_prepare``) and how the program's
result becomes a verdict (``_verdict``); running it, synchronously or from a GRPO batch's event
loop, and treating an overloaded pool as "not judged" rather than the completion's fault, is here.
"""

from __future__ import annotations

import logging
from typing import Any

from infra.sandbox.pool import PoolFull, QueueTimeout
from temper.verifiers.base import Verdict, Verifier, not_judged

log = logging.getLogger(__name__)


class PooledVerifier(Verifier):
    def _prepare(self, record: dict[str, Any], completion: str) -> tuple[Verdict | None, tuple | None]:
        """(verdict, None) when judged without running (None: the record does not apply), else
        (None, (pool, argv, exec_kwargs, context)); ``context`` goes to ``_verdict``."""
        raise NotImplementedError

    def _verdict(self, result, context: Any) -> Verdict | None:
        raise NotImplementedError

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        early, job = self._prepare(record, completion)
        if job is None:
            return early
        pool, argv, kwargs, context = job
        try:
            result = pool.exec(argv, **kwargs)
        except (PoolFull, QueueTimeout) as e:  # overload is not the completion's fault
            log.warning("%s: %s", self.family, e)
            return not_judged(f"sandbox overloaded: {e}")
        return self._verdict(result, context)

    async def ascore(self, record: dict[str, Any], completion: str) -> Verdict | None:
        early, job = self._prepare(record, completion)
        if job is None:
            return early
        pool, argv, kwargs, context = job
        try:
            result = await pool.aexec(argv, **kwargs)
        except (PoolFull, QueueTimeout) as e:
            log.warning("%s: %s", self.family, e)
            return not_judged(f"sandbox overloaded: {e}")
        return self._verdict(result, context)
