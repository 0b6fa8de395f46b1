"""Answer-matching families: numeric/math answers and exact/normalized/regex match."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from temper.verifiers.base import Verdict, Verifier
from temper.verifiers.registry import register

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def parse_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def extract_final_number(completion: str) -> str | None:
    """\\boxed{...} wins; otherwise the first number of the completion (models keep talking after it)."""
    boxed = _BOXED.findall(completion)
    if boxed:
        return boxed[-1]
    m = _NUMBER.search(completion.replace(",", ""))
    return m.group(0) if m else None


@register
class NumericVerifier(Verifier):
    """Reward 1 when the extracted answer equals ``record[answer_field]`` within ``tolerance``."""

    family = "numeric"

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        field = self.params.get("answer_field", "answer")
        if field not in record:
            return None
        gold = parse_number(str(record[field]))
        if gold is None:
            return None
        raw = extract_final_number(completion)
        got = parse_number(raw) if raw is not None else None
        if got is None:
            return Verdict(0.0, {"extracted": raw, "gold": str(gold), "reason": "no number"})
        tol = float(self.params.get("tolerance", 1e-6))
        ok = abs(float(got) - float(gold)) <= tol * max(1.0, abs(float(gold)))
        return Verdict(1.0 if ok else 0.0, {"extracted": raw, "gold": str(record[field])})


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", "", text.lower())).strip()


@register
class ExactVerifier(Verifier):
    """mode: exact | normalized | regex (``record[pattern_field]`` or params.pattern must match)."""

    family = "exact"

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        mode = self.params.get("mode", "normalized")
        if mode == "regex":
            pattern = self.params.get("pattern") or record.get(self.params.get("pattern_field", "pattern"))
            if not pattern:
                return None
            ok = re.search(pattern, completion) is not None
            return Verdict(float(ok), {"mode": mode})
        field = self.params.get("answer_field", "answer")
        if field not in record:
            return None
        gold, got = str(record[field]), completion.strip()
        ok = got == gold.strip() if mode == "exact" else normalize(got) == normalize(gold)
        return Verdict(float(ok), {"mode": mode})
