"""Family-specific rules. Each maps a row to True (ok) or False (violation).

GX checks columns, not Python semantics, so each rule computes a boolean column
``__rule__<rule>__<column>`` that the compiled suite then expects to be all True:
the check itself still runs, and is reported, through GX.
"""

from __future__ import annotations

import ast
import json
import shlex
from collections.abc import Callable
from fractions import Fraction
from typing import Any

RowRule = Callable[[Any, Any], bool]
RULES: dict[str, RowRule] = {}


def rule(name: str):
    def wrap(fn: RowRule) -> RowRule:
        RULES[name] = fn
        return fn

    return wrap


def derived_column(rule_name: str, column: str) -> str:
    return f"__rule__{rule_name}__{column}"


@rule("parses_as_number")
def parses_as_number(value: Any, _other: Any = None) -> bool:
    """Numeric answers: int, decimal or a fraction like 3/4."""
    try:
        Fraction(str(value).strip())
        return True
    except (ValueError, ZeroDivisionError):
        return False


@rule("parses_as_python")
def parses_as_python(value: Any, _other: Any = None) -> bool:
    if not isinstance(value, str) or not value.strip():
        return False
    try:
        ast.parse(value)
        return True
    except SyntaxError:
        return False


@rule("defines_check")
def defines_check(value: Any, _other: Any = None) -> bool:
    """HumanEval tests: a non-empty `def check(candidate)` with at least one assert."""
    if not parses_as_python(value):
        return False
    tree = ast.parse(value)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            return any(isinstance(n, ast.Assert) for n in ast.walk(node))
    return False


def _json_or_none(value: Any) -> Any:
    """The parsed JSON, or None when the value is not JSON text (None never passes the rules using it)."""
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return None


@rule("valid_json")
def valid_json(value: Any, _other: Any = None) -> bool:
    try:
        json.loads(value)
        return True
    except (TypeError, ValueError):
        return False


@rule("calls_offered_functions")
def calls_offered_functions(ground_truth: Any, functions: Any) -> bool:
    """BFCL ground truth names only functions that the record offers."""
    try:
        calls = json.loads(ground_truth)
        offered = {f["name"] for f in json.loads(functions)}
    except (TypeError, ValueError, KeyError):
        return False
    if not isinstance(calls, list) or not calls:
        return False
    return all(isinstance(c, dict) and len(c) == 1 and next(iter(c)) in offered for c in calls)


@rule("episode_turns")
def episode_turns(value: Any, _other: Any = None) -> bool:
    """A multi-step reference: a JSON list of turn texts, at least two actions and then the done action."""
    turns = _json_or_none(value)
    return (isinstance(turns, list) and len(turns) >= 3 and all(isinstance(t, str) and t.strip() for t in turns)
            and turns[-1].strip() == "<done/>")


@rule("json_state_differs")
def json_state_differs(value: Any, other: Any) -> bool:
    """An expected end state (JSON) that differs from the start state: doing nothing must not pass."""
    try:
        return json.loads(value) != json.loads(other)
    except (TypeError, ValueError):
        return False


@rule("hidden_cases")
def hidden_cases(value: Any, _other: Any = None) -> bool:
    """Repair tasks' judge: a non-empty JSON list of {module, function, args (a list), expect}."""
    cases = _json_or_none(value)
    return (isinstance(cases, list) and bool(cases)
            and all(isinstance(c, dict) and set(c) == {"module", "function", "args", "expect"}
                    and isinstance(c["module"], str) and isinstance(c["function"], str)
                    and isinstance(c["args"], list) for c in cases))


@rule("project_files")
def project_files(value: Any, package: Any) -> bool:
    """Repair tasks' start tree: JSON {relative path: text} with the package's __init__.py, run_tests.py and a
    tests/test_*.py; no absolute path and no '..' (the tree is written into the sandbox's work dir)."""
    files = _json_or_none(value)
    if not (isinstance(files, dict) and isinstance(package, str) and package.isidentifier()):
        return False
    paths = list(files)
    return (all(isinstance(p, str) and isinstance(t, str) and not p.startswith("/") and ".." not in p.split("/")
                for p, t in files.items())
            and f"{package}/__init__.py" in files and "run_tests.py" in files
            and any(p.startswith("tests/test_") and p.endswith(".py") for p in paths))


@rule("valid_bash")
def valid_bash(value: Any, _other: Any = None) -> bool:
    """Shell scripts: balanced quotes and no NUL bytes (a full parse needs bash; the sandbox has it)."""
    if not isinstance(value, str) or "\x00" in value:
        return False

    try:
        shlex.split(value, comments=True)
        return True
    except ValueError:
        return False


@rule("reasoning_gym_entry")
def reasoning_gym_entry(entry: Any, task: Any) -> bool:
    """A reasoning-gym row keeps the generator's own entry: question, answer, metadata naming its task."""
    try:
        e = json.loads(entry)
    except (TypeError, ValueError):
        return False
    return (isinstance(e, dict) and isinstance(e.get("question"), str) and "answer" in e
            and isinstance(e.get("metadata"), dict) and e["metadata"].get("source_dataset") == task)


@rule("tokens_near_target")
def tokens_near_target(tokens: Any, target: Any) -> bool:
    """A long-context prompt's real token count is within 1% of the length it was made for."""
    try:
        return abs(int(tokens) - int(target)) <= 0.01 * int(target)
    except (TypeError, ValueError):
        return False


@rule("answer_once_in_prompt")
def answer_once_in_prompt(answer: Any, prompt: Any) -> bool:
    """The answer is stated in the context exactly once: answerable, and not guessable from repetition."""
    return isinstance(answer, str) and isinstance(prompt, str) and bool(answer) and prompt.count(answer) == 1
