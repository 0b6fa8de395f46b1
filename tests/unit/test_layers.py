"""The tree's layering, read from the imports themselves (docs/ARCHITECTURE.md, "Rooms").

Every ``import`` of the project's own packages and of Prefect is collected with ``ast`` from
every module, wherever it sits in the module (top level or inside a function), and checked
against the rules below. A rule broken here is a room in the wrong place, not a style nit.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("temper", "infra", "data_contracts", "workloads", "tasks", "flows", "benchmarks")
# The library's rooms; benchmarks/ are scripts over them (a function-level import there is how a
# script picks what one measurement needs, so the `# lazy:` rule does not apply to them).
LIBRARY = tuple(p for p in PACKAGES if p != "benchmarks")

# room -> rooms it may import (itself is always allowed). A room is a top-level package, or
# `temper.core` (the leaf everything may import: settings, errors, the config-file loader, tag names).
ALLOWED = {
    "temper.core": set(),
    "data_contracts": {"temper.core"},
    "infra": {"temper.core"},
    "temper": {"temper.core", "infra", "data_contracts"},
    "workloads": {"temper.core", "temper", "infra", "data_contracts"},
    "tasks": {"temper.core", "temper", "infra", "data_contracts"},
    "flows": {"temper.core", "temper", "infra", "data_contracts", "tasks"},
    "benchmarks": {"temper.core", "temper", "infra", "data_contracts", "workloads", "tasks", "flows"},
}
# The domain core inside `temper/`, bottom to top: a module imports its own room and the rooms below
# it, never one above, whether at the top, in a function or under TYPE_CHECKING. Data (domains,
# catalog, generators) needs nothing above it; judges read domains and datasets; verifier families
# wrap judges and read data formats; training scores with verifiers; the lifecycle (validation
# included: it checks each domain's verifier params) uses all of them.
CORE_STACK = ("temper.data", "temper.judges", "temper.verifiers", "temper.training", "temper.lifecycle")
# Modules that may import Prefect (and flows/, tasks/) besides flows/ and tasks/ themselves: the
# CLI entry points that start flows or serve their deployments.
PREFECT_ENTRY_POINTS = {"temper.commands.demo", "temper.commands.up", "temper.commands.resume",
                        "temper.commands.data"}  # data generate announces changed datasets (retrain trigger)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def room(module: str) -> str:
    return "temper.core" if module == "temper.core" or module.startswith("temper.core.") else module.split(".")[0]


def modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(p): p for pkg in packages for p in sorted((REPO / pkg).rglob("*.py"))}


def core_room(module: str) -> str | None:
    return next((r for r in CORE_STACK if module == r or module.startswith(r + ".")), None)


def imports_of(path: Path, name: str) -> set[str]:
    """Absolute names imported by the module (relative imports resolved), TYPE_CHECKING blocks included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, name) for name, path in mods.items()}


def test_rooms_import_only_what_they_may(graph):
    broken = []
    for mod, imported in graph.items():
        for target in imported:
            if target.split(".")[0] not in PACKAGES:
                continue
            src, dst = room(mod), room(target)
            if mod in PREFECT_ENTRY_POINTS and dst in ("flows", "tasks"):
                continue  # a command that starts a flow imports it
            if dst != src and dst not in ALLOWED[src]:
                broken.append(f"{mod} imports {target} ({src} may not import {dst})")
    assert not broken, "\n".join(sorted(broken))


def test_domain_core_imports_only_downward(graph):
    """No module of the domain core imports a room above its own in CORE_STACK."""
    upward = []
    for mod, imported in graph.items():
        src = core_room(mod)
        for target in imported if src else ():
            dst = core_room(target)
            if dst and CORE_STACK.index(dst) > CORE_STACK.index(src):
                upward.append(f"{mod} imports {target} ({src} is below {dst})")
    assert not upward, "upward imports in the domain core (" + " < ".join(CORE_STACK) + "):\n" + "\n".join(sorted(upward))


def test_verifier_family_names_are_a_leaf(graph):
    """A Domain checks its family against these names on every catalog load: they import nothing of the project."""
    assert not [t for t in graph["temper.data.verifier_families"] if t.split(".")[0] in PACKAGES]


def test_prefect_only_in_flows_tasks_and_flow_starting_commands(graph):
    users = sorted(m for m, imported in graph.items()
                   if any(t == "prefect" or t.startswith("prefect.") for t in imported)
                   and room(m) not in ("flows", "tasks", "benchmarks") and m not in PREFECT_ENTRY_POINTS)
    assert users == [], f"Prefect imported outside flows/, tasks/ and flow-starting commands: {users}"


def test_no_import_cycles(graph):
    """No cycle among the project's modules (a `from pkg import name` edge goes to the module
    `pkg.name` when it exists, else to `pkg`)."""
    names = set(graph)
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, imported in graph.items():
        for target in imported:
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and target != mod and not mod.startswith(target + "."):  # a package's own __init__
                edges[mod].add(target)
    # Tarjan's strongly connected components: any component of size > 1 is a cycle.
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(names):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_workloads_never_import_prefect(graph):
    assert not [m for m, imported in graph.items() if room(m) == "workloads"
                and any(t.startswith("prefect") for t in imported)]


def _function_import_blocks(tree: ast.AST):
    """Runs of consecutive import statements inside a function body (nested blocks included)."""
    def walk(node, in_function):
        for field in ("body", "orelse", "finalbody", "handlers"):
            seq = getattr(node, field, None)
            if not isinstance(seq, list):
                continue
            run: list[ast.stmt] = []
            for stmt in seq + [None]:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    run.append(stmt)
                    continue
                if run and in_function:
                    yield run
                run = []
                if stmt is not None:
                    yield from walk(stmt, in_function or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)))
    yield from walk(tree, False)


def test_function_level_imports_say_why_they_are_lazy():
    """Imports sit at the top of a module; one inside a function needs a ``# lazy: <measured reason>``
    comment (on the comment lines right above its block, or on one of its lines), e.g. the seconds a
    library would add to every ``temper`` start-up. An unexplained one belongs at the top."""
    unexplained = []
    for name, path in modules(LIBRARY).items():
        lines = path.read_text().splitlines()
        for block in _function_import_blocks(ast.parse("\n".join(lines), filename=str(path))):
            first, last = block[0].lineno, block[-1].end_lineno
            above, i = [], first - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                above.append(lines[i])
                i -= 1
            if not any("# lazy:" in line for line in above + lines[first - 1:last]):
                unexplained.append(f"{path.relative_to(REPO)}:{first}: {lines[first - 1].strip()}")
    assert not unexplained, ("function-level imports without a `# lazy:` reason (move them to the top, "
                             "or say what importing them up there would cost):\n" + "\n".join(unexplained))
