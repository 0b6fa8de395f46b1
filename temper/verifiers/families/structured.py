"""Structured-output families: JSON field extraction and BFCL-style tool calls."""

from __future__ import annotations

import json
from typing import Any

from temper.verifiers.base import Verdict, Verifier
from temper.verifiers.families.matching import normalize
from temper.verifiers.registry import register


def first_json(text: str) -> Any:
    """The first JSON value in ``text`` (models often add prose around it); raises ValueError if none."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "[{":
            try:
                return decoder.raw_decode(text[i:])[0]
            except ValueError:
                continue
    raise ValueError("no JSON value in completion")


def _same(a: Any, b: Any, numeric: bool, tol: float) -> bool:
    if numeric:
        try:
            return abs(float(a) - float(b)) <= tol
        except (TypeError, ValueError):
            return False
    return normalize(str(a)) == normalize(str(b))


@register
class JSONExtractionVerifier(Verifier):
    """Partial credit: share of ``fields`` that match ``record[expected_field]`` (normalized)."""

    family = "json_extraction"

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        field = self.params.get("expected_field", "expected")
        if field not in record:
            return None
        expected = json.loads(record[field]) if isinstance(record[field], str) else record[field]
        fields = self.params.get("fields") or sorted(expected)
        numeric = set(self.params.get("numeric_fields", []))
        try:
            got = first_json(completion)
        except ValueError:
            return Verdict(0.0, {"reason": "no valid JSON object"})
        if not isinstance(got, dict):
            return Verdict(0.0, {"reason": f"expected an object, got {type(got).__name__}"})
        tol = float(self.params.get("tolerance", 0.01))
        matched = [f for f in fields if f in got and _same(got[f], expected.get(f), f in numeric, tol)]
        return Verdict(len(matched) / len(fields), {"matched": matched, "missing": [f for f in fields if f not in got]})


def _arg_ok(value: Any, allowed: list[Any]) -> bool:
    return any(value == a or (isinstance(a, str) and isinstance(value, str) and normalize(a) == normalize(value))
               for a in allowed)


def _call_ok(call: dict, truth: dict[str, dict[str, list[Any]]]) -> bool:
    (name, args), = truth.items()
    if call.get("name") != name:
        return False
    given = call.get("arguments") or {}
    if not isinstance(given, dict) or set(given) - set(args):
        return False
    return all(_arg_ok(given[k], v) if k in given else "" in v for k, v in args.items())


@register
class ToolCallVerifier(Verifier):
    """BFCL-style: every ground-truth call matched by exactly one predicted call, any order."""

    family = "tool_call"

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        if "ground_truth" not in record:
            return None
        truth = json.loads(record["ground_truth"])
        try:
            calls = first_json(completion)
        except ValueError:
            return Verdict(0.0, {"reason": "no JSON call list"})
        calls = [calls] if isinstance(calls, dict) else calls
        if not isinstance(calls, list) or len(calls) != len(truth):
            return Verdict(0.0, {"reason": f"expected {len(truth)} call(s)"})
        unused = list(range(len(calls)))
        for t in truth:
            hit = next((i for i in unused if isinstance(calls[i], dict) and _call_ok(calls[i], t)), None)
            if hit is None:
                return Verdict(0.0, {"reason": f"no call matches {next(iter(t))}"})
            unused.remove(hit)
        return Verdict(1.0, {"calls": len(calls)})
