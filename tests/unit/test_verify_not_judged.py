"""`temper verify` on records a verifier cannot judge (issue 29.9): each such record says why, and a
file where nothing was judged fails instead of printing an empty summary with exit 0."""

from __future__ import annotations

import json

import pytest

from temper.cli import main

# (family, params, record, the reason's expected text): one per way a family declines a record
NOT_JUDGED = [
    ("numeric", {}, {"question": "1+1"}, "record has no 'answer' (numeric answer_field)"),
    ("numeric", {"answer_field": "gold"}, {"answer": "2"}, "record has no 'gold'"),
    ("numeric", {}, {"answer": "two"}, "record's 'answer' is not a number: 'two'"),
    ("exact", {}, {"prompt": "p"}, "record has no 'answer' (exact answer_field)"),
    ("exact", {"mode": "regex"}, {"prompt": "p"}, "no regex: neither params.pattern nor record 'pattern'"),
    ("doc_qa", {}, {"document": "d"}, "record has no 'answer' (doc_qa answer_field)"),
    ("doc_qa", {"grounded": True}, {"document": "cats", "answer": "dogs"}, "no gold answer occurs in the record's document"),
    ("json_extraction", {}, {"text": "t"}, "record has no 'expected'"),
    ("json_extraction", {}, {"expected": "{oops"}, "record's 'expected' is not JSON"),
    ("json_extraction", {}, {"expected": "[]"}, "record's 'expected' is not a non-empty JSON object"),
    ("tool_call", {}, {"functions": "[]"}, "record has no 'ground_truth' (tool_call)"),
    ("tool_call", {}, {"ground_truth": "{oops"}, "record's 'ground_truth' or 'functions' is not JSON"),
    ("tool_call", {"checker": "bfcl"}, {"ground_truth": "[]"}, "unusable for the BFCL checker (KeyError"),
    ("code_tests", {}, {"prompt": "def f():", "test": "assert f()"}, "record has no 'entry_point'"),
    ("terminal", {}, {"setup": "true"}, "record has no 'setup' and 'check' (terminal, mode check)"),
    ("episode", {}, {"prompt": "p"}, "record has no 'instruction' (episode)"),
]


def _verify(tmp_path, capsys, family, params, rows):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    code = main(["verify", "--verifier", family, "--params", json.dumps(params), str(path)])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err.strip(), path


@pytest.mark.parametrize("family, params, record, why", NOT_JUDGED,
                         ids=[f"{f}-{i}" for i, (f, *_) in enumerate(NOT_JUDGED)])
def test_a_file_where_no_record_is_judged_says_why_and_fails(tmp_path, capsys, family, params, record, why):
    rows = [{"id": i, **record, "completion": "42"} for i in range(2)]
    code, lines, err, path = _verify(tmp_path, capsys, family, params, rows)
    assert code == 1
    assert [row["reward"] for row in lines[:2]] == [None, None]
    assert all(why in row["not_judged"] for row in lines[:2]), lines
    summary = lines[2]["summary"]
    assert (summary["judged"], summary["not_judged"]) == (0, 2)
    assert list(summary["not_judged_reasons"].values()) == [2] and why in next(iter(summary["not_judged_reasons"]))
    assert err.startswith(f"temper: error: {path}: no record was judged (2 record(s)): ") and why in err
    assert len(err.splitlines()) == 1


def test_judged_records_carry_no_reason_and_one_judged_record_is_enough(tmp_path, capsys):
    rows = [{"id": "a", "answer": "4", "completion": "4"}, {"id": "b", "question": "q", "completion": "4"},
            {"id": "c", "answer": "x", "completion": "4"}]
    code, lines, err, _ = _verify(tmp_path, capsys, "numeric", {}, rows)
    assert code == 0 and err == ""
    assert lines[0]["reward"] == 1.0 and "not_judged" not in lines[0]
    assert lines[3]["summary"]["not_judged_reasons"] == {
        "record has no 'answer' (numeric answer_field) to compare with": 1,
        "record's 'answer' is not a number: 'x'": 1}


def test_a_family_that_declines_without_a_reason_is_named(tmp_path, capsys, monkeypatch):
    from temper.verifiers.families.matching import NumericVerifier

    monkeypatch.setattr(NumericVerifier, "score", lambda self, record, completion: None)
    code, lines, err, _ = _verify(tmp_path, capsys, "numeric", {}, [{"answer": "4", "completion": "4"}])
    assert code == 1 and lines[0]["not_judged"] == "the numeric verifier returned no verdict and gave no reason"
    assert "no record was judged (1 record(s)): the numeric verifier returned no verdict" in err


def test_reasons_reach_the_listener_from_a_worker_thread_and_stay_in_their_record():
    import asyncio

    from temper.verifiers.base import not_judged, not_judged_reasons

    assert not_judged("nobody listens") is None  # outside a listener: just None

    async def score(reason):
        with not_judged_reasons() as why:
            await asyncio.to_thread(not_judged, reason)  # offloaded families score in a worker thread
            await asyncio.sleep(0)
        return why

    async def both():
        return await asyncio.gather(score("first"), score("second"))

    assert asyncio.run(both()) == [["first"], ["second"]]
