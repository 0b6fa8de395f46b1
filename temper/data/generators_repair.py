"""Repository-repair tasks: a small generated Python project with injected bugs, visible and hidden tests.

A record is one project (the module templates of ``temper.data.repair_projects``): ``modules`` modules
of a package with ``bugs`` injected slips of stated kinds (off-by-one, wrong operator, missing case, wrong import,
broken edge case), each in a different function; the modules without a bug are distractors. The
agent sees the package, ``tests/`` and ``run_tests.py`` (``start_files``); it is judged by
``hidden_tests``: every function of the package called on its edge inputs and on random inputs drawn
apart from the visible ones, the expected values computed here from the correct sources. Every bug
is caught by at least one visible test (the agent can find it) and one hidden case (the judge does),
each under its own comparison (a visible test's ``==``, the judge's ``repair_harness.same``), so the
buggy project fails the hidden cases (doing nothing never passes). ``reference`` is a scripted policy that runs the
tests, reads and rewrites each buggy module, runs them again and says done.

Tiers are generator params, so a catalog makes one domain per tier and the curriculum weighs them
by the signal they give: ``modules`` (files), ``bugs``, ``cross_module`` (a module that imports two
others, where a wrong import can hide).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pandas as pd

from temper.agent.environment import ACTION_HELP
from temper.agent.repair_harness import same
from temper.data.repair_projects import PACKAGES, Bug, ModuleTemplate, call, load_project, module_source, templates

VISIBLE_DRAWS = 1  # random inputs per function in the visible tests (besides its edges)
HIDDEN_DRAWS = 4  # in the hidden cases, drawn apart from the visible ones
HUNT = 200  # draws to find a hidden call that catches a bug the drawn ones miss

RUN_TESTS = '''"""Runs every test_* function of tests/test_*.py: a line per test, a summary, exit 1 on any failure."""
import importlib.util
import pathlib
import sys
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
passed = failed = 0
for path in sorted(pathlib.Path("tests").glob("test_*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        print(f"ERROR {path}: {type(e).__name__}: {e}")
        failed += 1
        continue
    for name in sorted(n for n in vars(module) if n.startswith("test_")):
        try:
            getattr(module, name)()
            print(f"PASS {path.stem}::{name}")
            passed += 1
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {path.stem}::{name}: {type(e).__name__}{f': {e}' if str(e) else ''} at line {where.lineno}:"
                  f" {where.line}")
            failed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
'''


def _plain(value: Any) -> Any:
    """A result as the judge sees it: through JSON."""
    return json.loads(json.dumps(value))


def _outcome(modules: dict, module: str, function: str, args: tuple) -> tuple[bool, Any]:
    ok, value = call(modules, module, function, args)
    return (ok, _plain(value)) if ok else (False, value)


def _key(module: str, function: str, args: tuple) -> tuple[str, str, str]:
    return module, function, json.dumps(args)


def _fails_visible(want: Any, got: tuple[bool, Any]) -> bool:
    """What a visible test's ``assert call == expected`` says of this outcome."""
    return not (got[0] and got[1] == want)


def _fails_hidden(want: Any, got: tuple[bool, Any]) -> bool:
    """What the judge says of this outcome (``repair_harness.same``)."""
    return not (got[0] and same(got[1], want))


def _project_modules(rng: random.Random, count: int, cross_module: bool) -> list[ModuleTemplate]:
    modules = templates()
    names = [n for n in modules if not modules[n].needs]
    chosen = ["report", *modules["report"].needs] if cross_module else []
    rng.shuffle(names)
    for name in names:
        if len(chosen) >= count:
            break
        if name not in chosen:
            chosen.append(name)
    return [modules[n] for n in sorted(chosen)]


def _test_file(package: str, template: ModuleTemplate, cases: dict[str, list[tuple]], expected: dict) -> str:
    lines = [f'"""Tests of {package}.{template.name}."""', "", f"from {package}.{template.name} import "
             + ", ".join(sorted(cases)), ""]
    for function in sorted(cases):
        lines += ["", "", f"def test_{function}():"]
        for args in cases[function]:
            call_text = f"{function}({', '.join(repr(a) for a in args)})"
            lines.append(f"    assert {call_text} == {expected[_key(template.name, function, args)]!r}")
    return "\n".join(lines) + "\n"


def _hunt(rng: random.Random, template: ModuleTemplate, function: str, good: dict, bad: dict,
          taken: set) -> tuple[str, str, tuple] | None:
    """A new call of ``function`` on which the buggy project's answer fails the judge, or None."""
    for _ in range(HUNT):
        args = template.functions[function].args(rng)
        case = (template.name, function, args)
        if _key(*case) not in taken and _fails_hidden(_outcome(good, *case)[1], _outcome(bad, *case)):
            return case
    return None


def _draw_distinct(rng: random.Random, template: ModuleTemplate, function: str, avoid: set, n: int) -> list[tuple]:
    out: list[tuple] = []
    for _ in range(20 * n):
        if len(out) == n:
            break
        args = template.functions[function].args(rng)
        key = json.dumps(args)
        if key not in avoid:
            avoid.add(key)
            out.append(args)
    return out


def make_project(rng: random.Random, modules: int, bugs: int, cross_module: bool) -> dict[str, Any] | None:
    """One record's fields, or None when this draw's bugs are not each caught by both suites."""
    package = rng.choice(PACKAGES)
    project = _project_modules(rng, modules, cross_module)
    candidates = [b for t in project for b in t.bugs]
    if cross_module:  # the tier's point: a wrong import is one of the bugs
        imports = [b for b in candidates if b.kind == "wrong_import"]
        picked = [rng.choice(imports)]
        candidates = [b for b in candidates if b.function != picked[0].function]
    else:
        picked = []
    rng.shuffle(candidates)
    for bug in candidates:
        if len(picked) < bugs and all(b.function != bug.function for b in picked):
            picked.append(bug)
    if len(picked) < bugs:
        return None
    owner = {id(b): t.name for t in project for b in t.bugs}
    by_module: dict[str, tuple[Bug, ...]] = {t.name: tuple(b for b in picked if owner[id(b)] == t.name)
                                             for t in project}
    correct = {t.name: module_source(t, package) for t in project}
    good = load_project(package, correct)

    visible: dict[str, dict[str, list[tuple]]] = {}
    hidden: list[tuple[str, str, tuple]] = []
    for t in project:
        visible[t.name] = {}
        for function in t.functions:
            edges = t.functions[function].edge_args
            seen = {json.dumps(e) for e in edges}
            visible[t.name][function] = edges + _draw_distinct(rng, t, function, seen, VISIBLE_DRAWS)
            hidden += [(t.name, function, a) for a in edges + _draw_distinct(rng, t, function, seen, HIDDEN_DRAWS)]
    shown = [(m, f, a) for m in visible for f in visible[m] for a in visible[m][f]]
    expected = {_key(*c): _outcome(good, *c)[1] for c in shown + hidden}

    # Each bug alone must be caught by a visible test (the agent can find it) and by a hidden case whose call
    # the visible tests do not show: a program that answers the visible calls from a table and runs the buggy
    # code otherwise must still fail (found by a red-team review: with the edges alone catching a bug such as
    # last_n(xs, 0), it passed). Where no hidden case does, up to HUNT draws look for one; none: a new project.
    shown_keys = {_key(*c) for c in shown}
    for bug in picked:
        module = owner[id(bug)]
        alone = load_project(package, {**correct, module: module_source(templates()[module], package, (bug,))})
        if not any(_fails_visible(expected[_key(*c)], _outcome(alone, *c)) for c in shown):
            return None
        apart = [c for c in hidden if _key(*c) not in shown_keys]
        if not any(_fails_hidden(expected[_key(*c)], _outcome(alone, *c)) for c in apart):
            case = _hunt(rng, templates()[module], bug.function, good, alone, shown_keys | {_key(*c) for c in hidden})
            if case is None:
                return None
            hidden.append(case)
            expected[_key(*case)] = _outcome(good, *case)[1]
    try:
        sources = {t.name: module_source(t, package, by_module[t.name]) for t in project}
    except ValueError:  # one bug's edit undid another's text
        return None
    buggy = load_project(package, sources)  # and all of them together, on calls the visible tests do not show
    if not any(_fails_hidden(expected[_key(*c)], _outcome(buggy, *c)) for c in hidden if _key(*c) not in shown_keys):
        return None
    files = {f"{package}/__init__.py": f'"""{package}: small utilities."""\n', "run_tests.py": RUN_TESTS}
    files |= {f"{package}/{name}.py": text for name, text in sources.items()}
    files |= {f"tests/test_{t.name}.py": _test_file(package, t, visible[t.name], expected) for t in project}
    fixes = [name for name in sorted(sources) if by_module[name]]
    turns = ["<bash>python3 run_tests.py</bash>"]
    for name in fixes:
        turns += [f"<bash>cat {package}/{name}.py</bash>", f'<write path="{package}/{name}.py">{correct[name]}</write>']
    turns += ["<bash>python3 run_tests.py</bash>", "<done/>"]
    listing = "\n".join(sorted(files))
    instruction = (f"This work directory holds a small Python project, package `{package}`:\n{listing}\n\n"
                   "Some of its tests fail (`python3 run_tests.py` runs them). Find the bugs in the package and "
                   "fix them, so that every function does what its docstring says. The project is judged by "
                   f"another, hidden test suite on your final files.\n{ACTION_HELP}")
    cases = [{"module": m, "function": f, "args": list(a), "expect": expected[_key(m, f, a)]} for m, f, a in hidden]
    return {"instruction": instruction, "package": package, "start_files": json.dumps(files, sort_keys=True),
            "hidden_tests": json.dumps(cases), "reference": json.dumps(turns),
            "bugs": json.dumps([{"module": owner[id(b)], "function": b.function, "kind": b.kind} for b in picked]),
            "modules": len(project), "bug_count": len(picked)}


def repair_tasks(rows: int, seed: int = 0, eval_fraction: float = 0.1, modules: int = 2, bugs: int = 1,
                 cross_module: bool = False) -> pd.DataFrame:
    most = len(templates()) - (0 if cross_module else 1)  # the module that imports others only with cross_module
    if not 1 <= bugs <= modules <= most:
        raise ValueError(f"repair_tasks: need 1 <= bugs ({bugs}) <= modules ({modules}) <= {most}")
    if cross_module and modules < 1 + len(templates()["report"].needs):
        raise ValueError(f"repair_tasks: cross_module needs modules >= {1 + len(templates()['report'].needs)}")
    tag = f"repair{modules}{bugs}{'x' if cross_module else ''}"
    rng = random.Random(f"{tag}:{seed}")
    records: list[dict[str, Any]] = []
    for _ in range(50 * rows):
        if len(records) == rows:
            break
        project = make_project(rng, modules, bugs, cross_module)
        if project is None:
            continue
        records.append({"id": f"{tag}-{seed}-{len(records):06d}", **project,
                        "split": "eval" if rng.random() < eval_fraction else "train"})
    if len(records) < rows:
        raise ValueError(f"repair_tasks: only {len(records)} of {rows} projects had every bug caught by both suites")
    return pd.DataFrame.from_records(records)
