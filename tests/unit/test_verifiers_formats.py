"""Public benchmark formats -> domain records whose reference the family's verifier accepts."""

import json

import pytest

from temper.core.errors import DatasetError
from temper.data.formats import stable_split
from temper.data.formats.bfcl import load_bfcl
from temper.data.formats.humaneval import to_record
from temper.data.formats.nl2bash import load_nl2bash
from temper.verifiers import get_verifier

BFCL_Q = [
    {"id": "simple_0", "question": [[{"role": "user", "content": "Area of a triangle with base 10 and height 5?"}]],
     "function": [{"name": "calc_area", "description": "area", "parameters": {
         "type": "dict", "required": ["base", "height"],
         "properties": {"base": {"type": "integer"}, "height": {"type": "integer"}, "unit": {"type": "string"}}}}]},
    {"id": "parallel_0", "question": [[{"role": "user", "content": "Weather in Paris and in Rome"}]],
     "function": [{"name": "weather", "parameters": {"type": "dict", "required": ["city"],
                                                      "properties": {"city": {"type": "string"}}}}]},
]
BFCL_A = [
    {"id": "simple_0", "ground_truth": [{"calc_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]},
    {"id": "parallel_0", "ground_truth": [{"weather": {"city": ["Paris"]}}, {"weather": {"city": ["Rome"]}}]},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bfcl_records_score_their_reference(tmp_path):
    recs = load_bfcl(write_jsonl(tmp_path / "q.jsonl", BFCL_Q), write_jsonl(tmp_path / "a.jsonl", BFCL_A))
    assert [r["id"] for r in recs] == ["bfcl-simple_0", "bfcl-parallel_0"]
    assert recs[0]["query"].startswith("Area of a triangle")
    assert json.loads(recs[0]["reference"]) == [{"name": "calc_area", "arguments": {"base": 10, "height": 5}}]
    v = get_verifier("tool_call")
    assert [v.score(r, r["reference"]).reward for r in recs] == [1.0, 1.0]
    assert v.score(recs[1], '[{"name": "weather", "arguments": {"city": "Rome"}}]').reward == 0.0


def test_bfcl_unmatched_question_names_it(tmp_path):
    with pytest.raises(DatasetError, match="'parallel_0' has no entry"):
        load_bfcl(write_jsonl(tmp_path / "q.jsonl", BFCL_Q), write_jsonl(tmp_path / "a.jsonl", BFCL_A[:1]))


def test_humaneval_record_schema():
    problem = {"task_id": "HumanEval/7", "prompt": "def f(x):\n", "canonical_solution": "    return x\n",
               "test": "def check(c):\n    assert c(1) == 1\n", "entry_point": "f"}
    rec = to_record(problem)
    assert rec["id"] == "humaneval-7" and rec["reference"] == problem["canonical_solution"]
    assert rec["split"] == to_record(problem)["split"] in ("train", "eval")
    with pytest.raises(DatasetError, match="missing field"):
        to_record({"task_id": "HumanEval/8"})


def test_nl2bash_pairs(tmp_path):
    (tmp_path / "all.nl").write_text("list files\ncount lines of a.txt\n")
    (tmp_path / "all.cm").write_text("ls\nwc -l < a.txt\n")
    recs = load_nl2bash(tmp_path / "all.nl", tmp_path / "all.cm")
    assert [(r["instruction"], r["reference"]) for r in recs] == [("list files", "ls"), ("count lines of a.txt", "wc -l < a.txt")]
    assert all(r["setup"] and r["check"] == "" for r in recs)
    (tmp_path / "all.cm").write_text("ls\n")
    with pytest.raises(DatasetError, match="line-aligned"):
        load_nl2bash(tmp_path / "all.nl", tmp_path / "all.cm")


def test_stable_split_is_deterministic_and_near_the_fraction():
    splits = [stable_split(f"id-{i}", 0.2) for i in range(2000)]
    assert splits == [stable_split(f"id-{i}", 0.2) for i in range(2000)]
    assert 0.17 < splits.count("eval") / len(splits) < 0.23
