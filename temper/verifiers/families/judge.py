"""The ``judge`` family: a judge model scores open-ended responses against the domain's rubric.

params (typed in temper.judges.params): rubric (a name under rubrics/, a path, or an inline
mapping), judge (a JudgeSpec: local ``model`` folder or ``base_url`` + ``endpoint_model``), prompt_template
(str.format over the record: what the judge is told the task was), reference_field (a
record column shown to the judge as the reference answer), calibration (per-domain overrides
of the calibration gate; read by temper.judges.calibration, not here).

A judge output without a parseable score is not a 0: ``score`` returns None, logs the item
and the reason, and counts it in ``skipped`` / ``skips``, so a reward mean never includes
a score the judge did not give.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from temper.judges import JudgeError, UnparseableOutput
from temper.judges.judge import Judge, JudgeResult
from temper.judges.params import parse_params
from temper.verifiers.base import Verdict, Verifier, not_judged

log = logging.getLogger(__name__)
MAX_SKIPS_KEPT = 100


class JudgeVerifier(Verifier):
    family = "judge"
    known_params = None  # typed: JudgeVerifierParams refuses unknown fields itself
    offload = True  # an endpoint call, or a local judge model (torch releases the GIL)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config, self.rubric = parse_params(params)
        self.judge = Judge(self.config.judge)
        self.skipped: Counter[str] = Counter()
        self.skips: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def _skip(self, item: str, kind: str, reason: str) -> None:
        log.warning("judge: item %s skipped (%s): %s", item, kind, reason)
        with self._lock:
            self.skipped[kind] += 1
            if len(self.skips) < MAX_SKIPS_KEPT:
                self.skips.append({"item": item, "kind": kind, "reason": reason})
        return not_judged(f"judge {kind}: {reason}")

    def judge_record(self, record: dict[str, Any], completion: str) -> JudgeResult:
        """The full judge result for one record; raises JudgeError (naming the item) or KeyError."""
        item = str(record.get("id", "?"))
        prompt = self.config.prompt_template.format(**record)
        reference = None
        if self.config.reference_field:
            reference = str(record[self.config.reference_field])
        return self.judge.score(self.rubric, prompt, completion, reference=reference, item_id=item)

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        item = str(record.get("id", "?"))
        if (bad := self.screen(record, completion)) is not None:
            return bad  # empty or huge: not worth a judge call
        try:
            result = self.judge_record(record, completion)
        except KeyError as e:
            return self._skip(item, "missing_column", f"record has no column {e.args[0]!r}")
        except UnparseableOutput as e:
            return self._skip(item, "unparseable", str(e))
        except JudgeError as e:
            return self._skip(item, "judge_error", str(e))
        return Verdict(result.score, {"raw_score": result.raw_score, "rationale": result.rationale,
                                      "scale": [self.rubric.scale.min, self.rubric.scale.max],
                                      "digest": result.digest, "cached": result.cached, "judge": result.judge_id})
