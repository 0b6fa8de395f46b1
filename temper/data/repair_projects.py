"""The building blocks of the repository-repair domains: small Python modules, their bugs, their inputs.

Each module template is a YAML file in ``repair_templates/`` (one per module, so adding a module is
adding a file): the correct ``source`` of one module of a generated project (``PKG`` stands for the
package's name), ``needs`` (the sibling modules it imports) and, per function, what the tests call it
with: ``edges`` (the argument lists a careful suite always has: empty lists, boundaries) and ``draw``
(how to draw an ordinary one: one spec per argument, see ``DRAWS``). Each of its ``bugs`` is one
exact text edit of the source, of a stated kind, that a realistic slip would make;
``tests/unit/test_repair_projects.py`` checks that every edit applies exactly once and changes what its
function returns. Sources are executed here only to compute the expected values (``load_project``:
our own code, never a model's).
"""

from __future__ import annotations

import builtins
import functools
import random
import types
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from temper.core.config_files import load_config
from temper.core.errors import DatasetError

BugKind = Literal["off_by_one", "wrong_operator", "missing_case", "wrong_import", "broken_edge_case"]
BUG_KINDS: tuple[BugKind, ...] = ("off_by_one", "wrong_operator", "missing_case", "wrong_import", "broken_edge_case")
TEMPLATES = Path(__file__).with_name("repair_templates")
PACKAGES = ("toolkit", "appcore", "helpers", "mylib")
_WORDS = ["red", "Green", "blue", "Tea", "time", "API", "v2", "data", "set", "x", "Level", "noon"]


def _ints(rng: random.Random, spec: dict[str, Any]) -> list[int]:
    (lo, hi), (low, high) = spec["ints"], spec.get("values", (-20, 50))
    return [rng.randint(low, high) for _ in range(rng.randint(lo, hi))]


def _text(rng: random.Random, spec: dict[str, Any]) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(*spec["text"]))]
    seps = [rng.choice([" ", " ", "  ", ", ", "! "]) for _ in words]
    return "".join(w + s for w, s in zip(words, seps)).strip()


# One argument's draw: {ints: [min len, max len], values: [low, high] (default -20..50)}, {int: [low,
# high]}, {text: [min words, max words]} (words and separators of a short text), {choice: [values]}.
DRAWS = {"ints": _ints, "int": lambda rng, spec: rng.randint(*spec["int"]), "text": _text,
         "choice": lambda rng, spec: rng.choice(spec["choice"])}


class Bug(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: BugKind
    function: str  # the function whose results it changes (a wrong import changes its user's)
    old: str
    new: str


class FunctionInputs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    edges: list[list[Any]]
    draw: list[dict[str, Any]]

    @field_validator("draw")
    @classmethod
    def _known_draws(cls, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for spec in specs:
            kinds = [k for k in spec if k in DRAWS]
            if len(kinds) != 1:
                raise ValueError(f"draw spec {spec} names {len(kinds)} of the kinds {sorted(DRAWS)}; it needs one")
        return specs

    def args(self, rng: random.Random) -> tuple:
        """One ordinary argument tuple."""
        return tuple(DRAWS[next(k for k in spec if k in DRAWS)](rng, spec) for spec in self.draw)

    @property
    def edge_args(self) -> list[tuple]:
        return [tuple(e) for e in self.edges]


class ModuleTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str
    functions: dict[str, FunctionInputs]
    bugs: tuple[Bug, ...]
    needs: tuple[str, ...] = ()  # sibling modules it imports


@functools.cache
def templates() -> dict[str, ModuleTemplate]:
    """Every module template, by name (read once)."""
    found = [load_config(p, ModuleTemplate, DatasetError, "repair template") for p in sorted(TEMPLATES.glob("*.yaml"))]
    return {t.name: t for t in found}


def module_source(template: ModuleTemplate, package: str, bugs: tuple[Bug, ...] = ()) -> str:
    """The module's source with ``bugs`` applied (each must match exactly once)."""
    source = template.source
    for bug in bugs:
        if source.count(bug.old) != 1:
            raise ValueError(f"bug {bug.kind}/{bug.function} does not match {template.name} exactly once")
        source = source.replace(bug.old, bug.new)
    return source.replace("PKG", package)


def load_project(package: str, sources: dict[str, str]) -> dict[str, types.ModuleType]:
    """Our own module sources executed as ``package.name`` modules, without touching sys.modules: a
    module's ``from package.x import y`` is served from the others (loaded in dependency order). A
    module that fails to import (a wrong import) is left out, as are the modules that import it."""
    loaded: dict[str, types.ModuleType] = {}
    failed: set[str] = set()

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        prefix = package + "."
        if name.startswith(prefix) and name[len(prefix):] in loaded:
            return loaded[name[len(prefix):]]
        return builtins.__import__(name, globals, locals, fromlist, level)

    pending = dict(sources)
    while pending:
        ready = [n for n in pending if all(d in loaded or d in failed for d in templates()[n].needs)]
        if not ready:
            raise ValueError(f"modules {sorted(pending)} need modules that are not in the project")
        for name in ready:
            module = types.ModuleType(f"{package}.{name}")
            module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _import}
            try:
                exec(compile(pending.pop(name), f"{package}/{name}.py", "exec"), module.__dict__)
            except Exception:
                failed.add(name)
                continue
            loaded[name] = module
    return loaded


def call(modules: dict[str, types.ModuleType], module: str, function: str, args: tuple) -> tuple[bool, Any]:
    """(True, result) or (False, the exception's name) of one call; a module that did not load raises
    ImportError at every call."""
    if module not in modules:
        return False, "ImportError"
    try:
        return True, getattr(modules[module], function)(*args)
    except Exception as e:
        return False, type(e).__name__
