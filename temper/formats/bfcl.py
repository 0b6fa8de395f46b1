"""BFCL (Berkeley Function Calling Leaderboard) question + possible-answer files -> tool_calls records.

BFCL keeps questions (``id``, ``question``: list of turns of chat messages, ``function``: list
of function docs) and ground truth (``id``, ``ground_truth``: list of ``{func: {arg: [allowed
values]}}``, where ``""`` among the allowed values marks an optional argument) in two JSONL
files joined by ``id``. The reference completion takes the first allowed value of every
argument and leaves out optional ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temper.errors import DatasetError
from temper.formats import stable_split
from temper.formats.humaneval import read_jsonl


def _query(question: Any) -> str:
    """The user text of the first turn ('question' is [[{role, content}, ...]] in BFCL v3)."""
    turns = question if isinstance(question, list) else [question]
    messages = turns[0] if turns and isinstance(turns[0], list) else turns
    texts = [m["content"] for m in messages if isinstance(m, dict) and m.get("role", "user") == "user"]
    if isinstance(question, str):
        return question
    if not texts:
        raise ValueError("no user message")
    return "\n".join(texts)


def reference_calls(ground_truth: list[dict[str, dict[str, list[Any]]]]) -> list[dict[str, Any]]:
    calls = []
    for entry in ground_truth:
        (name, args), = entry.items()
        calls.append({"name": name, "arguments": {k: v[0] for k, v in args.items() if v and "" not in v}})
    return calls


def to_records(questions: list[dict[str, Any]], answers: list[dict[str, Any]], eval_fraction: float = 0.1) -> list[dict]:
    by_id = {a["id"]: a for a in answers}
    records = []
    for q in questions:
        qid = q.get("id")
        if qid not in by_id:
            raise DatasetError(f"BFCL question {qid!r} has no entry in the possible-answer file")
        try:
            query = _query(q["question"])
            truth = by_id[qid]["ground_truth"]
            functions = q["function"] if isinstance(q["function"], list) else [q["function"]]
        except (KeyError, ValueError, TypeError) as e:
            raise DatasetError(f"BFCL question {qid!r}: malformed ({e})") from None
        rid = f"bfcl-{qid}"
        records.append({
            "id": rid, "split": stable_split(rid, eval_fraction), "query": query,
            "functions": json.dumps(functions), "ground_truth": json.dumps(truth),
            "reference": json.dumps(reference_calls(truth)),
        })
    return records


def load_bfcl(questions_path: str | Path, answers_path: str | Path, eval_fraction: float = 0.1) -> list[dict]:
    return to_records(read_jsonl(questions_path), read_jsonl(answers_path), eval_fraction)
