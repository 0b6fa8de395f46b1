"""BFCL (Berkeley Function Calling Leaderboard) question + possible-answer files -> tool_calls records.

BFCL keeps questions (``id``, ``question``: list of turns of chat messages, ``function``: list
of function docs) and ground truth (``id``, ``ground_truth``: list of ``{func: {arg: [allowed
values]}}``, where ``""`` among the allowed values marks an optional argument) in two JSONL
files joined by ``id``. The reference completion takes the first allowed value of every
argument (nested dicts alike) and leaves out optional ones (``""`` allowed) unless the function's
schema requires them.

The ``bfcl-eval`` package ships these files (``bfcl_eval/data``) and BFCL's own AST checker. It
is installed without its dependencies (they pin numpy 1.26.4 and pull faiss and
sentence-transformers), so this module only reads files from it and loads the checker module
(pure Python) with its one heavy import, the table of model handlers, replaced by a stand-in:
the checker asks that table only whether a model writes '.' as '_' in function names.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import sys
import types
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from temper.core.errors import DatasetError
from temper.data.formats import stable_split
from temper.data.formats.humaneval import read_jsonl

VERSION_PREFIX = "BFCL_v4"
#: Single-turn Python categories whose answers BFCL checks by AST (the ones this adapter serves).
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
INSTALL_HINT = "pip install --no-deps bfcl-eval==2026.3.23"


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


_NONE = object()


def _concrete(value: Any) -> Any:
    """A possible-answer value made concrete: nested dicts map keys to lists of allowed values too."""
    if isinstance(value, dict):
        out = {k: _pick(v, required=False) if isinstance(v, list) else _concrete(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not _NONE}
    if isinstance(value, list):
        return [_concrete(v) for v in value]
    return value


def _pick(allowed: list[Any], required: bool) -> Any:
    """The first allowed value; _NONE (leave the argument out) when '' is allowed and the schema does
    not require it: BFCL's '' means 'may be omitted', and its ground truth sometimes allows a value
    for a parameter the function does not even declare."""
    if "" in allowed and not required:
        return _NONE
    return next((_concrete(a) for a in allowed if a != ""), _NONE)


def reference_calls(ground_truth: list[dict[str, dict[str, list[Any]]]],
                    functions: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One accepted answer: each argument's first allowed value, nested dicts resolved the same way,
    optional arguments left out unless the function's schema requires them."""
    required = {f.get("name"): set((f.get("parameters") or {}).get("required", [])) for f in functions or []
                if isinstance(f, dict)}
    calls = []
    for entry in ground_truth:
        (name, args), = entry.items()
        picked = {k: _pick(v, k in required.get(name, ())) for k, v in args.items()}
        calls.append({"name": name, "arguments": {k: v for k, v in picked.items() if v is not _NONE}})
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
            "reference": json.dumps(reference_calls(truth, functions)),
        })
    return records


def load_bfcl(questions_path: str | Path, answers_path: str | Path, eval_fraction: float = 0.1) -> list[dict]:
    return to_records(read_jsonl(questions_path), read_jsonl(answers_path), eval_fraction)


def package_data_dir() -> Path:
    """``bfcl_eval/data`` of the installed package, found without importing it."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(f"BFCL: the bfcl-eval package is not installed ({INSTALL_HINT})")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_packaged(category: str, eval_fraction: float = 1.0) -> list[dict]:
    if category not in CATEGORIES:
        raise DatasetError(f"BFCL: category {category!r} is not one of {', '.join(CATEGORIES)}")
    data = package_data_dir()
    name = f"{VERSION_PREFIX}_{category}.json"  # JSON lines despite the suffix
    return load_bfcl(data / name, data / "possible_answer" / name, eval_fraction)


def bfcl_frame(rows: int, seed: int = 0, eval_fraction: float = 1.0, category: str = "simple_python") -> pd.DataFrame:
    """The first ``rows`` questions of one packaged BFCL category, in file order (``seed`` unused)."""
    records = load_packaged(category, eval_fraction)
    if rows > len(records):
        raise DatasetError(f"BFCL {category} has {len(records)} questions, domain asks for rows={rows}")
    return pd.DataFrame.from_records(records[:rows])


@lru_cache(maxsize=1)
def ast_checker():
    """BFCL's own ``ast_checker(func_description, model_output, possible_answer, language, category, model)``."""
    if package_data_dir() and "bfcl_eval.constants.model_config" not in sys.modules:
        stand_in = types.ModuleType("bfcl_eval.constants.model_config")
        stand_in.__doc__ = "temper's stand-in: no handler imports; no model renames '.' to '_'."
        stand_in.MODEL_CONFIG_MAPPING = defaultdict(lambda: types.SimpleNamespace(underscore_to_dot=False))
        sys.modules[stand_in.__name__] = stand_in
    module = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    language = importlib.import_module("bfcl_eval.constants.enums").Language.PYTHON
    return lambda functions, calls, truth, category: module.ast_checker(functions, calls, truth, language,
                                                                        category, "temper")


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ValueError("not a function name")


def decode_python_calls(text: str) -> list[dict[str, dict[str, Any]]] | None:
    """BFCL's prompt format ``[f(a=1), mod.g(b='x')]`` -> ``[{"f": {"a": 1}}, ...]``; None if not that.

    Arguments must be literals (``ast.literal_eval``): nothing in the completion is executed.
    """
    start, end = text.find("["), text.rfind("]")
    if start == -1 or end <= start:
        return None
    try:
        node = ast.parse(text[start:end + 1].strip(), mode="eval").body
        if not isinstance(node, ast.List) or not all(isinstance(c, ast.Call) and not c.args for c in node.elts):
            return None
        return [{_dotted(c.func): {k.arg: ast.literal_eval(k.value) for k in c.keywords}} for c in node.elts]
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
