"""Long-document question answering: the answer is checked against gold, numerically or as text.

A numeric gold answer ("1,250.00", "3/4") is compared like the numeric family; a text answer
is compared normalized, against any of its aliases: exact -> 1; otherwise, with
``partial: true``, token F1 of the completion's first line (SQuAD-style) as partial credit.
``grounded: true`` also requires the gold answer to occur in the record's document, so a
record whose gold answer is not supported by its document is not judged (None).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import NonNegativeFloat

from temper.verifiers.base import Verdict, Verifier, not_judged
from temper.verifiers.families.matching import (
    PICK,
    candidates,
    extract_final_number,
    normalize,
    numbers_match,
    parse_number,
)


def token_f1(pred: str, gold: str) -> float:
    p, g = normalize(pred).split(), normalize(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if not p or not g or not common:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def answer_span(completion: str) -> str:
    """The answer part: after 'Answer:' if present, first non-empty line, trailing period dropped."""
    text = completion.strip()
    low = text.lower()
    if "answer:" in low:
        text = text[low.rindex("answer:") + len("answer:"):].strip()
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    return line.strip().rstrip(".")


class DocQAVerifier(Verifier):
    """params: answer_field ('answer'; str or list of aliases), document_field ('document'),
    tolerance (1e-6 relative), partial (false), grounded (false)."""

    family = "doc_qa"
    known_params = {"answer_field": str | list[str], "document_field": str, "grounded": bool, "pick": PICK,
                    "tolerance": NonNegativeFloat, "partial": bool}
    input_fields = ("document", "question", "context")

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        field = self.params.get("answer_field", "answer")
        gold_raw = record.get(field)
        if gold_raw is None or gold_raw == "" or gold_raw == []:
            return not_judged(f"record has no {field!r} (doc_qa answer_field) to compare with")
        golds = [str(g) for g in gold_raw] if isinstance(gold_raw, list) else [str(gold_raw)]
        if self.params.get("grounded"):
            doc = normalize(str(record.get(self.params.get("document_field", "document"), "")))
            if not any(normalize(g) in doc for g in golds):
                return not_judged("grounded: no gold answer occurs in the record's document")
        if (bad := self.screen(record, completion)) is not None:
            return bad
        completion = self.without_inputs(record, completion)
        numeric = [n for n in (parse_number(g) for g in golds) if n is not None]
        if numeric and len(numeric) == len(golds):
            raw = extract_final_number(completion, self.params.get("pick", "first"))
            tol = float(self.params.get("tolerance", 1e-6))
            ok = any(numbers_match(got, g, tol) for got in candidates(raw) for g in numeric)
            return Verdict(float(ok), {"kind": "number", "extracted": raw})
        span = answer_span(completion)
        if any(normalize(span) == normalize(g) for g in golds):
            return Verdict(1.0, {"kind": "text", "extracted": span})
        if self.params.get("partial"):
            f1 = max(token_f1(span, g) for g in golds)
            return Verdict(round(f1, 4), {"kind": "text", "extracted": span, "f1": round(f1, 4)})
        return Verdict(0.0, {"kind": "text", "extracted": span})
