"""Reading a score out of judge text. No guessing: anything ambiguous is 'no score'.

Accepted: a JSON object with a ``score`` key (and optionally ``rationale``), else the last
``Score: N`` / ``Score: N/M`` line. ``N`` must lie on the rubric's scale and ``M`` (when
given) must be the scale's max: a '7/10' from a judge told to use 1..5 is a judge that did
not follow the rubric, and clipping it would invent a score.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from temper.judges.rubric import Scale

_SCORE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+))?", re.I)
_JSON = re.compile(r"\{[^{}]*\}", re.S)


class ScoreParseError(ValueError):
    """The text holds no score, or one that is not on the scale."""


@dataclass(frozen=True)
class ParsedScore:
    raw: float
    rationale: str


def _from_json(text: str) -> ParsedScore | None:
    for blob in _JSON.findall(text):
        try:
            obj = json.loads(blob)
        except ValueError:
            continue
        if isinstance(obj, dict) and "score" in obj:
            value = obj["score"]
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ScoreParseError(f"JSON score {value!r} is not a number")
            try:
                raw = float(value)
            except ValueError:
                raise ScoreParseError(f"JSON score {value!r} is not a number") from None
            return ParsedScore(raw, str(obj.get("rationale", "")).strip())
    return None


def parse_score(text: str, scale: Scale) -> ParsedScore:
    """The judge's score on ``scale`` and its rationale; ``ScoreParseError`` says why not."""
    parsed = _from_json(text)
    if parsed is None:
        matches = list(_SCORE.finditer(text))
        if not matches:
            raise ScoreParseError(f"no 'Score: N' line or JSON score in judge output {_clip(text)!r}")
        m = matches[-1]
        if m.group(2) is not None and int(m.group(2)) != scale.max:
            raise ScoreParseError(f"score {m.group(0)!r} is out of {m.group(2)}, the rubric scale is "
                                  f"{scale.min}..{scale.max}")
        parsed = ParsedScore(float(m.group(1)), text[:m.start()].strip())
    if not scale.min <= parsed.raw <= scale.max:
        raise ScoreParseError(f"score {parsed.raw:g} is outside the rubric scale {scale.min}..{scale.max}")
    return parsed


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
