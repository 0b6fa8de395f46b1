"""Answer-matching families: numeric/math answers and exact/normalized/regex match. In process, fast.

Numeric extraction order: the last ``\\boxed{...}`` (braces balanced, so ``\\boxed{\\frac{3}{4}}``
works), else the number after the last explicit answer marker ("####", "answer is", "Answer:"),
else the first number of the completion (``pick: last`` for chain-of-thought style outputs;
the default is first because small models keep talking after the answer).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Literal

from pydantic import NonNegativeFloat

from temper.verifiers.base import Verdict, Verifier, not_judged

#: Which number of a completion is its answer when nothing marks one (a boxed or "answer:" number wins).
PICK = Literal["first", "last"]

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?%?"
_NUMBER = re.compile(_NUM)
_MARKER = re.compile(r"(?:####|final answer\s*(?:is)?\s*:?|answer\s*(?:is|:|=))\s*\$?\s*(" + _NUM + ")", re.I)
MAX_EXPONENT = 400  # beyond this an answer is not a number anyone means
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def _boxed(text: str) -> list[str]:
    """Contents of every \\boxed{...}, with nested braces balanced."""
    found, i = [], text.find("\\boxed{")
    while i != -1:
        depth, j = 1, i + len("\\boxed{")
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:
            found.append(text[i + len("\\boxed{"): j - 1])
        i = text.find("\\boxed{", j)
    return found


def parse_number(text: str) -> Fraction | None:
    """'3/4', '-2.5', '1,234', '$12', '\\frac{3}{4}', '12.', '50%' (= 1/2) as an exact Fraction."""
    t = _FRAC.sub(r"(\1)/(\2)", text.strip()).replace("$", "").replace("(", "").replace(")", "")
    t = _THOUSANDS.sub("", t).replace(" ", "").rstrip(".")
    percent = t.endswith("%")
    exponent = re.search(r"[eE]([+-]?\d+)", t)
    if exponent and abs(int(exponent.group(1))) > MAX_EXPONENT:
        return None  # Fraction('1e999999999') would build a billion-digit integer
    try:
        value = Fraction(t.rstrip("%"))
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


def extract_final_number(completion: str, pick: str = "first") -> str | None:
    boxed = _boxed(completion)
    if boxed:
        return boxed[-1]
    text = _THOUSANDS.sub("", completion)
    marked = _MARKER.findall(text)
    if marked:
        return marked[-1]
    nums = _NUMBER.findall(text)
    if not nums:
        return None
    return nums[-1] if pick == "last" else nums[0]


def candidates(raw: str | None) -> list[Fraction]:
    """Values an extracted answer may mean: '50%' is 0.5 or (when the gold is in percent) 50."""
    if raw is None:
        return []
    values = [parse_number(raw)] + ([parse_number(raw.rstrip().rstrip("%"))] if raw.rstrip().endswith("%") else [])
    return [v for v in values if v is not None]


def numbers_match(got: Fraction, gold: Fraction, tolerance: float, relative: bool = True) -> bool:
    """Exact Fraction arithmetic: model output such as '1e999999' or '1/000...1' must not overflow a float."""
    scale = max(Fraction(1), abs(gold)) if relative else Fraction(1)
    return abs(got - gold) <= Fraction(tolerance) * scale


class NumericVerifier(Verifier):
    """Reward 1 when the extracted answer equals ``record[answer_field]`` within ``tolerance``.

    params: answer_field ('answer'), tolerance (1e-6, relative to max(1, |gold|) unless
    relative=false), pick ('first' | 'last' number when there is no box/marker).
    """

    family = "numeric"
    known_params = {"answer_field": str, "pick": PICK, "tolerance": NonNegativeFloat, "relative": bool}
    input_fields = ("question", "problem", "prompt")

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        field = self.params.get("answer_field", "answer")
        if field not in record or record[field] is None:
            return not_judged(f"record has no {field!r} (numeric answer_field) to compare with")
        gold = parse_number(str(record[field]))
        if gold is None:  # the record's own answer is not a number: not ours to judge
            return not_judged(f"record's {field!r} is not a number: {str(record[field])[:80]!r}")
        if (bad := self.screen(record, completion)) is not None:
            return bad
        raw = extract_final_number(self.without_inputs(record, completion), self.params.get("pick", "first"))
        got = candidates(raw)
        if not got:
            return Verdict(0.0, {"extracted": raw, "gold": str(record[field]), "reason": "no number"})
        tol, rel = float(self.params.get("tolerance", 1e-6)), bool(self.params.get("relative", True))
        ok = any(numbers_match(g, gold, tol, rel) for g in got)
        return Verdict(1.0 if ok else 0.0, {"extracted": raw, "gold": str(record[field])})


def normalize(text: str) -> str:
    """Lowercase, punctuation dropped, whitespace collapsed: 'The  Answer!' == 'the answer'."""
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", "", text.lower())).strip()


class ExactVerifier(Verifier):
    """mode: exact | normalized | regex.

    exact/normalized compare with ``record[answer_field]`` (a list means any of them);
    regex needs params.pattern or ``record[pattern_field]`` to match (re.search, or fullmatch
    with full=true). ``stop``: cut the completion at the first of these strings first.
    """

    family = "exact"
    known_params = {"mode": Literal["exact", "normalized", "regex"], "stop": list[str], "pattern": str,
                    "pattern_field": str, "full": bool, "answer_field": str}
    input_fields = ("question", "prompt", "problem")

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        mode = self.params.get("mode", "normalized")
        for stop in self.params.get("stop", []):
            completion = completion.split(stop, 1)[0]
        if mode == "regex":
            pattern = self.params.get("pattern") or record.get(self.params.get("pattern_field", "pattern"))
            if not pattern:
                return not_judged(f"no regex: neither params.pattern nor record "
                                  f"{self.params.get('pattern_field', 'pattern')!r}")
            if (bad := self.screen(record, completion)) is not None:
                return bad
            completion = self.without_inputs(record, completion)
            try:
                rx = re.compile(pattern, re.S)
            except re.error as e:
                return Verdict(0.0, {"mode": mode, "reason": f"bad pattern: {e}"})
            hit = rx.fullmatch(completion.strip()) if self.params.get("full") else rx.search(completion)
            return Verdict(float(hit is not None), {"mode": mode})
        field = self.params.get("answer_field", "answer")
        if field not in record or record[field] is None:
            return not_judged(f"record has no {field!r} (exact answer_field) to compare with")
        golds = record[field] if isinstance(record[field], list) else [record[field]]
        if (bad := self.screen(record, completion)) is not None:
            return bad
        got = self.without_inputs(record, completion).strip()
        if mode == "exact":
            ok = any(got == str(g).strip() for g in golds)
        else:
            ok = any(normalize(got) == normalize(str(g)) for g in golds)
        return Verdict(float(ok), {"mode": mode})
