"""Structured-output families: JSON field extraction and BFCL-style tool calls. In process, fast."""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from typing import Any, Literal

from pydantic import NonNegativeFloat

from temper.data.formats.bfcl import ast_checker, decode_python_calls
from temper.verifiers.base import Verdict, Verifier, not_judged
from temper.verifiers.families.matching import normalize, parse_number

_DATE_FORMATS = ("%Y-%m-%d", "%Y/%m/%d", "%d.%m.%Y", "%m/%d/%Y", "%d %B %Y", "%B %d, %Y", "%d %b %Y", "%b %d, %Y")


def first_json(text: str) -> Any:
    """The first JSON object/array in ``text`` (models add prose or ``` fences); ValueError if none."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "[{":
            try:
                return decoder.raw_decode(text[i:])[0]
            except ValueError:
                continue
    raise ValueError("no JSON value in completion")


def _as_date(value: Any) -> date | None:
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(str(value).strip(), fmt).date()
        except ValueError:
            continue
    return None


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    parsed = parse_number(re.sub(r"[^\d.,/%+-]", "", str(value))) if value is not None else None
    return None if parsed is None else float(parsed)


def field_matches(got: Any, want: Any, kind: str, tol: float) -> bool:
    if kind == "number":
        a, b = _as_number(got), _as_number(want)
        return a is not None and b is not None and abs(a - b) <= tol
    if kind == "date":
        a, b = _as_date(got), _as_date(want)
        return a is not None and a == b
    return normalize(str(got)) == normalize(str(want))


def schema_errors(obj: dict, schema: dict | None, expected: dict, kinds: dict[str, str]) -> list[str]:
    """Problems with the object's shape: against ``schema`` when given (jsonschema), else field types."""
    if schema is not None:
        # lazy: jsonschema (60 ms) would load whenever flows.human_validation is imported
        import jsonschema

        return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)][:5]
    errors = []
    for name in expected:
        if name not in obj:
            errors.append(f"missing field {name!r}")
        elif kinds.get(name) == "number" and not isinstance(obj[name], (int, float)) and _as_number(obj[name]) is None:
            errors.append(f"field {name!r} is not a number")
        elif obj[name] is None or isinstance(obj[name], (dict, list)):
            errors.append(f"field {name!r} is {type(obj[name]).__name__}, expected a scalar")
    return errors


class JSONExtractionVerifier(Verifier):
    """Partial credit: share of ``fields`` equal to ``record[expected_field]`` after normalization.

    params: expected_field ('expected'), fields (default: all expected keys), numeric_fields and
    date_fields (compared as numbers within ``tolerance`` / as calendar dates), schema (a JSON
    schema; default: every expected field present with a scalar of the right kind),
    require_schema (false: an invalid object still earns per-field credit, flagged in details).
    """

    family = "json_extraction"
    known_params = {"expected_field": str, "fields": list[str], "numeric_fields": list[str], "date_fields": list[str],
                    "schema": dict[str, Any], "require_schema": bool, "tolerance": NonNegativeFloat}
    input_fields = ("document", "text")

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        field = self.params.get("expected_field", "expected")
        if record.get(field) is None:
            return not_judged(f"record has no {field!r} (json_extraction expected_field)")
        try:
            expected = json.loads(record[field]) if isinstance(record[field], str) else record[field]
        except ValueError:  # the record's gold is broken, not the completion
            return not_judged(f"record's {field!r} is not JSON")
        if not isinstance(expected, dict) or not expected:
            return not_judged(f"record's {field!r} is not a non-empty JSON object")
        fields = self.params.get("fields") or sorted(expected)
        kinds = {f: "number" for f in self.params.get("numeric_fields", [])}
        kinds.update({f: "date" for f in self.params.get("date_fields", [])})
        if (bad := self.screen(record, completion)) is not None:
            return bad
        try:
            got = first_json(self.without_inputs(record, completion))
        except ValueError:
            return Verdict(0.0, {"reason": "no valid JSON object"})
        if not isinstance(got, dict):
            return Verdict(0.0, {"reason": f"expected an object, got {type(got).__name__}"})
        problems = schema_errors(got, self.params.get("schema"), {f: expected.get(f) for f in fields}, kinds)
        if problems and self.params.get("require_schema"):
            return Verdict(0.0, {"schema_valid": False, "schema_errors": problems})
        tol = float(self.params.get("tolerance", 0.01))
        matched = [f for f in fields if f in got and field_matches(got[f], expected.get(f), kinds.get(f, "text"), tol)]
        return Verdict(len(matched) / len(fields), {
            "matched": matched, "wrong": [f for f in fields if f in got and f not in matched],
            "missing": [f for f in fields if f not in got], "schema_valid": not problems, "schema_errors": problems,
        })


def _value_ok(value: Any, allowed: Any) -> bool:
    """BFCL's comparison: ints pass for floats, strings compare normalized, lists/dicts element-wise."""
    if isinstance(allowed, bool) or isinstance(value, bool):
        return type(value) is type(allowed) and value == allowed
    if isinstance(allowed, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(allowed)
    if isinstance(allowed, str) and isinstance(value, str):
        return normalize(value) == normalize(allowed)
    if isinstance(allowed, list) and isinstance(value, list):
        return len(value) == len(allowed) and all(_value_ok(v, a) for v, a in zip(value, allowed))
    if isinstance(allowed, dict) and isinstance(value, dict):
        return set(value) == set(allowed) and all(_value_ok(value[k], allowed[k]) for k in allowed)
    return value == allowed


def _arguments(call: dict) -> dict | None:
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return args if isinstance(args, dict) else None


def call_problem(call: Any, truth: dict[str, dict[str, list[Any]]], required: dict[str, list[str]]) -> str | None:
    """Why ``call`` does not satisfy one ground-truth entry; None if it does."""
    (name, spec), = truth.items()
    if not isinstance(call, dict) or call.get("name") != name:
        return f"name is not {name!r}"
    args = _arguments(call)
    if args is None:
        return "arguments are not an object"
    unknown = set(args) - set(spec)
    if unknown:
        return f"unexpected argument(s) {sorted(unknown)}"
    missing = [k for k in required.get(name, []) if k not in args]
    if missing:
        return f"required argument(s) {missing} missing"
    for k, allowed in spec.items():
        if k not in args:
            if "" not in allowed and None not in allowed:  # BFCL marks optional args with ""
                return f"argument {k!r} missing"
        elif not any(_value_ok(args[k], a) for a in allowed):
            return f"argument {k!r}={args[k]!r} not in {allowed!r}"
    return None


class ToolCallVerifier(Verifier):
    """BFCL-style AST match: every ground-truth call matched by exactly one predicted call, any order.

    Binary like BFCL (a half-right call list is a wrong call list). Required parameters come from
    the record's ``functions`` (JSON schema) when present.
    """

    family = "tool_call"
    known_params = {"checker": Literal["temper", "bfcl"], "category": str}
    input_fields = ("query", "functions")

    def score(self, record: dict[str, Any], completion: str) -> Verdict | None:
        if self.params.get("checker", "temper") == "bfcl":
            return self._score_bfcl(record, completion)
        return self._score_temper(record, completion)

    def _score_bfcl(self, record: dict[str, Any], completion: str) -> Verdict | None:
        """BFCL's own AST checker (``category`` param: simple_python, multiple, parallel, parallel_multiple)."""
        try:
            truth, functions = json.loads(record["ground_truth"]), json.loads(record["functions"])
        except (KeyError, TypeError, ValueError) as e:
            return not_judged(f"record's 'ground_truth'/'functions' unusable for the BFCL checker "
                              f"({type(e).__name__}: {e})")
        if (bad := self.screen(record, completion)) is not None:
            return bad
        text = self.without_inputs(record, completion)
        calls = decode_python_calls(text)
        if calls is None:
            try:
                got = first_json(text)
            except ValueError:
                return Verdict(0.0, {"reason": "no call list"})
            got = [got] if isinstance(got, dict) else got
            if not isinstance(got, list) or not all(isinstance(c, dict) for c in got):
                return Verdict(0.0, {"reason": "calls are not objects"})
            calls = [{c["name"]: _arguments(c)} if "name" in c else c for c in got]
        if not all(len(c) == 1 and isinstance(next(iter(c.values())), dict) for c in calls):
            return Verdict(0.0, {"reason": "a call has no argument object"})
        try:
            result = ast_checker()(functions, calls, truth, self.params.get("category", "simple_python"))
        except Exception as e:  # the checker's own failure on a malformed call is a wrong answer
            return Verdict(0.0, {"reason": f"BFCL checker: {type(e).__name__}: {e}"})
        return Verdict(1.0 if result.get("valid") else 0.0, {"errors": result.get("error", [])[:3]})

    def _score_temper(self, record: dict[str, Any], completion: str) -> Verdict | None:
        if record.get("ground_truth") is None:
            return not_judged("record has no 'ground_truth' (tool_call)")
        try:
            truth = json.loads(record["ground_truth"]) if isinstance(record["ground_truth"], str) else record["ground_truth"]
            fns = record.get("functions") or []
            functions = json.loads(fns) if isinstance(fns, str) else fns
        except ValueError:
            return not_judged("record's 'ground_truth' or 'functions' is not JSON")
        truth = [truth] if isinstance(truth, dict) else truth
        required = {f.get("name"): list((f.get("parameters") or {}).get("required", [])) for f in functions
                    if isinstance(f, dict)}
        if (bad := self.screen(record, completion)) is not None:
            return bad
        try:
            calls = first_json(self.without_inputs(record, completion))
        except ValueError:
            return Verdict(0.0, {"reason": "no JSON call list"})
        calls = [calls] if isinstance(calls, dict) else calls
        if not isinstance(calls, list) or len(calls) != len(truth):
            n = len(calls) if isinstance(calls, list) else 0
            return Verdict(0.0, {"reason": f"expected {len(truth)} call(s), got {n}"})
        unused = list(range(len(calls)))
        for t in truth:
            hit = next((i for i in unused if call_problem(calls[i], t, required) is None), None)
            if hit is None:
                why = [call_problem(calls[i], t, required) for i in unused]
                return Verdict(0.0, {"reason": f"no call matches {next(iter(t))}", "problems": why})
            unused.remove(hit)
        return Verdict(1.0, {"calls": len(calls)})
