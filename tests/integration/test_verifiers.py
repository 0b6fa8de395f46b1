import json

import pytest

from temper.data.generators import generate
from temper.verifiers import get_verifier
from temper.verifiers.families import FAMILIES


def test_all_catalog_families_are_registered():
    assert {"numeric", "exact", "json_extraction", "tool_call", "code_tests", "terminal"} <= {cls.family for cls in FAMILIES}


@pytest.mark.parametrize("completion,reward", [(" 12", 1.0), ("12 and more", 1.0), (r"so \boxed{24/2}", 1.0),
                                               ("13", 0.0), ("none", 0.0)])
def test_numeric(completion, reward):
    assert get_verifier("numeric").score({"answer": "12"}, completion).reward == reward


def test_not_applicable_is_none():
    assert get_verifier("numeric").score({"question": "x"}, "1") is None
    assert get_verifier("tool_call").score({"answer": "1"}, "[]") is None


def test_json_partial_credit():
    rec = {"expected": json.dumps({"a": "X Y", "total": 10.5})}
    v = get_verifier("json_extraction", {"numeric_fields": ["total"]})
    assert v.score(rec, 'sure: {"a": "x  y", "total": "10.50"}').reward == 1.0
    assert v.score(rec, '{"a": "nope", "total": 10.5}').reward == pytest.approx(0.5)
    assert v.score(rec, "no json").reward == 0.0


def test_tool_calls_parallel_order_insensitive():
    gt = json.dumps([{"f": {"x": [1]}}, {"g": {"y": ["a"]}}])
    v = get_verifier("tool_call")
    assert v.score({"ground_truth": gt}, '[{"name": "g", "arguments": {"y": "a"}}, {"name": "f", "arguments": {"x": 1}}]').reward == 1.0
    assert v.score({"ground_truth": gt}, '[{"name": "f", "arguments": {"x": 2}}, {"name": "g", "arguments": {"y": "a"}}]').reward == 0.0


@pytest.mark.parametrize("name,family", [("arithmetic", "numeric"), ("invoice_extraction", "json_extraction"),
                                         ("tool_calls", "tool_call"), ("python_functions", "code_tests"),
                                         ("shell_tasks", "terminal")])
def test_reference_completions_score_full_and_garbage_scores_zero(name, family):
    v = get_verifier(family, {"numeric_fields": ["total"]} if family == "json_extraction" else {})
    for rec in generate(name, 8, 0, 0.1, {}).to_dict(orient="records"):
        assert v.score(rec, rec["reference"]).reward == 1.0, rec["id"]
        assert v.score(rec, "garbage").reward == 0.0, rec["id"]


def test_code_timeout_is_zero():
    rec = generate("python_functions", 1, 0, 0.1, {}).iloc[0].to_dict()
    assert get_verifier("code_tests", {"timeout_s": 1}).score(rec, "    while True: pass\n").reward == 0.0
