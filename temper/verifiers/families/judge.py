"""The 'judge' verifier family: a rubric judge for open-ended domains (summaries, advice, analysis).

params: rubric (path to rubrics/<domain>.yaml, relative to the repo or absolute), model (local HF
folder of the judge) or base_url (+ model) of an OpenAI-compatible endpoint, prompt_field
('prompt'). A judge output without a score gives ``None`` (not a 0), with the reason in the
log, and is counted in ``unscored``: such an item is never scored silently.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from temper.judges.judge import JudgeOutputError, get_judge
from temper.judges.rubric import load_rubric
from temper.verifiers.base import Verdict, Verifier
from temper.verifiers.registry import register

REPO = Path(__file__).resolve().parents[3]
log = logging.getLogger("temper.judge")


@register
class JudgeVerifier(Verifier):
    family = "judge"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if "rubric" not in params:
            raise ValueError("judge verifier: params.rubric (a rubric YAML path) is required")
        path = Path(params["rubric"])
        self.rubric = load_rubric(path if path.is_absolute() else REPO / path)
        self.prompt_field = params.get("prompt_field", "prompt")
        self._judge_args = {k: params[k] for k in ("model", "base_url", "cache_path") if params.get(k)}
        self.unscored: list[str] = []  # one message per item skipped because the judge gave no score

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        item = str(record.get("id", "item"))
        if self.prompt_field not in record:
            return None
        judge = get_judge(**self._judge_args)
        try:
            v = judge.score(self.rubric, str(record[self.prompt_field]), completion, item)
        except JudgeOutputError as e:
            self.unscored.append(str(e))  # the message names the item
            log.warning("%s", e)
            return None
        return Verdict(v.reward, {"score": v.score, "rationale": v.rationale, "cached": v.cached})
