"""BFCL domains: the packaged data, BFCL's own AST checker, and references it accepts."""

import json

import pytest

from temper.data.catalog import load_catalog
from temper.data.formats.bfcl import CATEGORIES, decode_python_calls, load_packaged
from temper.verifiers import get_verifier

CATALOG = load_catalog("domains")


@pytest.mark.parametrize("category", CATEGORIES)
def test_bfcl_references_pass_bfcls_own_checker_and_a_dropped_or_changed_call_fails(category):
    domain = CATALOG[f"bfcl_{category}"]
    v = get_verifier(domain.verifier.family, domain.verifier.params)
    records = load_packaged(category)
    assert [r["id"] for r in records if v.score(r, r["reference"]).reward != 1.0] == []
    for r in records:
        calls = json.loads(r["reference"])
        dropped = calls[:-1] or [{"name": calls[0]["name"], "arguments": {}}]
        assert v.score(r, json.dumps(dropped)).reward == 0.0, r["id"]
        renamed = [{**calls[0], "name": calls[0]["name"] + "_x"}] + calls[1:]
        assert v.score(r, json.dumps(renamed)).reward == 0.0, r["id"]


def test_bfcl_prompt_syntax_is_parsed_without_executing_it():
    assert decode_python_calls("[math.hypot(x=4, y=5), f(s='a')]") == [{"math.hypot": {"x": 4, "y": 5}}, {"f": {"s": "a"}}]
    assert decode_python_calls("[f(x=__import__('os').system('id'))]") is None
    record = load_packaged("simple_python")[0]  # calculate_triangle_area(base=10, height=5)
    v = get_verifier("tool_call", {"checker": "bfcl", "category": "simple_python"})
    assert v.score(record, "[calculate_triangle_area(base=10, height=5)]").reward == 1.0
    assert v.score(record, "[calculate_triangle_area(base=10, height=6)]").reward == 0.0
