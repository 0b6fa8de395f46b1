"""The building blocks of the repository-repair domains: small Python modules, their bugs, their inputs.

Each ``ModuleTemplate`` is the correct source of one module of a generated project (``PKG`` stands
for the package's name) and, per function, what the tests call it with: ``edges`` (the inputs a
careful test suite always has: empty lists, boundaries) and ``draw`` (random ordinary inputs).
Each ``Bug`` is one exact text edit of that source, of a stated kind, that a realistic slip would
make; ``tests/unit/test_repair_projects.py`` checks that every edit applies exactly once and
changes what its function returns on its inputs. Sources are executed here only to compute the
expected values (``load_project``: our own code, never a model's).
"""

from __future__ import annotations

import builtins
import random
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

BugKind = Literal["off_by_one", "wrong_operator", "missing_case", "wrong_import", "broken_edge_case"]
BUG_KINDS: tuple[BugKind, ...] = ("off_by_one", "wrong_operator", "missing_case", "wrong_import", "broken_edge_case")


@dataclass(frozen=True)
class Bug:
    kind: BugKind
    function: str  # the function whose results it changes (a wrong import changes its user's)
    old: str
    new: str


@dataclass(frozen=True)
class FunctionInputs:
    """Argument tuples: the edges every suite has, and a draw of an ordinary one."""

    edges: tuple[tuple, ...]
    draw: Callable[[random.Random], tuple]


@dataclass(frozen=True)
class ModuleTemplate:
    name: str
    source: str
    functions: dict[str, FunctionInputs]
    bugs: tuple[Bug, ...]
    needs: tuple[str, ...] = field(default=())  # sibling modules it imports


def _ints(rng: random.Random, lo: int = 0, hi: int = 9, low: int = -20, high: int = 50) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(lo, hi))]


_WORDS = ["red", "Green", "blue", "Tea", "time", "API", "v2", "data", "set", "x", "Level", "noon"]


def _text(rng: random.Random, lo: int = 0, hi: int = 7) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    seps = [rng.choice([" ", " ", "  ", ", ", "! "]) for _ in words]
    return "".join(w + s for w, s in zip(words, seps)).strip()


STATS = ModuleTemplate("stats", '''"""Small statistics over lists of numbers."""


def mean(xs):
    """Arithmetic mean of xs; 0.0 for an empty list."""
    if not xs:
        return 0.0
    return sum(xs) / len(xs)


def median(xs):
    """Middle value of xs (the mean of the two middle ones for an even count); None for an empty list."""
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    if len(s) % 2:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def clamp(x, lo, hi):
    """x limited to the closed range [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def running_total(xs):
    """Prefix sums: element i is xs[0] + ... + xs[i]."""
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out
''', {
    "mean": FunctionInputs((([],), ([5],), ([1, 2],)), lambda r: (_ints(r, 1, 8),)),
    "median": FunctionInputs((([],), ([3],), ([4, 1],), ([5, 1, 3],)), lambda r: (_ints(r, 1, 8),)),
    "clamp": FunctionInputs(((0, 0, 10), (10, 0, 10), (-1, 0, 10), (11, 0, 10)),
                            lambda r: (r.randint(-30, 30), r.randint(-10, 0), r.randint(1, 20))),
    "running_total": FunctionInputs((([],), ([7],)), lambda r: (_ints(r, 1, 8),)),
}, (
    Bug("missing_case", "mean", "    if not xs:\n        return 0.0\n", ""),
    Bug("wrong_operator", "mean", "sum(xs) / len(xs)", "sum(xs) // len(xs)"),
    Bug("off_by_one", "median", "(s[mid - 1] + s[mid]) / 2", "(s[mid] + s[mid + 1]) / 2"),
    Bug("broken_edge_case", "median", "    s = sorted(xs)\n", "    s = list(xs)\n"),
    Bug("off_by_one", "clamp", "        return hi\n", "        return hi - 1\n"),
    Bug("wrong_operator", "clamp", "    if x < lo:\n", "    if x > lo:\n"),
    Bug("wrong_operator", "running_total", "total += x", "total -= x"),
    Bug("off_by_one", "running_total", "for x in xs:", "for x in xs[1:]:"),
))

TEXT = ModuleTemplate("text", '''"""Helpers for short texts."""


def slugify(title):
    """Lower-case words of title joined by '-'; characters other than letters, digits and spaces dropped."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c == " ")
    return "-".join(kept.split())


def count_words(text):
    """Number of whitespace-separated words in text."""
    return len(text.split())


def truncate_words(text, n):
    """The first n words of text, joined by single spaces; '...' appended when words were dropped."""
    words = text.split()
    if len(words) <= n:
        return " ".join(words)
    return " ".join(words[:n]) + "..."


def is_palindrome(text):
    """True when text reads the same backwards, ignoring case and characters other than letters and digits."""
    chars = [c.lower() for c in text if c.isalnum()]
    return chars == chars[::-1]
''', {
    "slugify": FunctionInputs((("",), ("Hello  World",), ("API v2!",)), lambda r: (_text(r, 1),)),
    "count_words": FunctionInputs((("",), ("one",), ("two  words",)), lambda r: (_text(r),)),
    "truncate_words": FunctionInputs((("a b c", 3), ("a b c", 2), ("", 1)),
                                     lambda r: (_text(r, 1), r.randint(0, 5))),
    "is_palindrome": FunctionInputs((("",), ("Noon",), ("Top, spot!",), ("Tea time",)),
                                    lambda r: (r.choice(["Level", "noon, noon", "Tea, time", "x", "Red rum, sir"]),)),
}, (
    Bug("broken_edge_case", "slugify", '"-".join(kept.split())', '"-".join(kept.split(" "))'),
    Bug("wrong_operator", "slugify", 'c.isalnum() or c == " "', 'c.isalnum() and c == " "'),
    Bug("broken_edge_case", "count_words", "len(text.split())", 'len(text.split(" "))'),
    Bug("off_by_one", "truncate_words", "words[:n]", "words[:n - 1]"),
    Bug("wrong_operator", "truncate_words", "len(words) <= n", "len(words) < n"),
    Bug("missing_case", "is_palindrome", "[c.lower() for c in text if c.isalnum()]", "[c.lower() for c in text]"),
))

SEQS = ModuleTemplate("seqs", '''"""List utilities."""


def chunk(xs, size):
    """xs cut into consecutive lists of size elements; the last one may be shorter."""
    return [xs[i:i + size] for i in range(0, len(xs), size)]


def window_sums(xs, k):
    """Sum of every run of k consecutive elements, in order; [] when xs has fewer than k."""
    return [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)]


def last_n(xs, n):
    """The last n elements of xs (all of them when n >= len(xs)); [] for n == 0."""
    if n == 0:
        return []
    return xs[-n:]


def dedupe(xs):
    """xs without repeated elements, keeping the first occurrence of each, in order."""
    seen, out = set(), []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out
''', {
    "chunk": FunctionInputs((([], 2), ([1, 2, 3], 2), ([1, 2, 3, 4, 5], 2)),
                            lambda r: (_ints(r, 0, 9), r.randint(1, 4))),
    "window_sums": FunctionInputs((([], 1), ([1, 2], 3), ([1, 2, 3], 3), ([1, 2, 3, 4], 2)),
                                  lambda r: (_ints(r, 0, 8), r.randint(1, 4))),
    "last_n": FunctionInputs((([1, 2, 3], 0), ([1, 2, 3], 5), ([1, 2, 3], 1)),
                             lambda r: (_ints(r, 1, 8), r.randint(0, 6))),
    "dedupe": FunctionInputs((([],), ([1, 2, 1],)), lambda r: ([r.randint(0, 5) for _ in range(r.randint(2, 10))],)),
}, (
    Bug("off_by_one", "chunk", "range(0, len(xs), size)", "range(0, len(xs) - 1, size)"),
    Bug("off_by_one", "window_sums", "range(len(xs) - k + 1)", "range(len(xs) - k)"),
    Bug("missing_case", "last_n", "    if n == 0:\n        return []\n", ""),
    Bug("broken_edge_case", "dedupe", "if x not in seen:", "if x not in out[-1:]:"),
))

MONEY = ModuleTemplate("money", '''"""Amounts of money in whole cents."""


def apply_discount(cents, percent):
    """Price after a percent discount, rounded down to a whole cent."""
    return cents * (100 - percent) // 100


def split_bill(total, people):
    """total cents split among people as evenly as possible: the first total % people shares get one cent more."""
    base, extra = divmod(total, people)
    return [base + 1 if i < extra else base for i in range(people)]


def add_tax(cents, rate_percent):
    """cents plus rate_percent tax, the tax rounded half up to a whole cent."""
    return cents + (cents * rate_percent + 50) // 100
''', {
    "apply_discount": FunctionInputs(((0, 10), (999, 0), (1000, 100)),
                                     lambda r: (r.randint(1, 5000), r.randint(1, 90))),
    "split_bill": FunctionInputs(((10, 3), (9, 3), (1, 4)), lambda r: (r.randint(0, 500), r.randint(1, 7))),
    "add_tax": FunctionInputs(((0, 20), (50, 1), (150, 1)), lambda r: (r.randint(1, 5000), r.randint(1, 25))),
}, (
    Bug("wrong_operator", "apply_discount", "(100 - percent)", "(100 + percent)"),
    Bug("off_by_one", "split_bill", "i < extra", "i <= extra"),
    Bug("broken_edge_case", "add_tax", "(cents * rate_percent + 50) // 100", "(cents * rate_percent) // 100"),
))

REPORT = ModuleTemplate("report", '''"""Summaries built from the stats and text modules."""

from PKG.stats import mean, median
from PKG.text import slugify


def summary(xs):
    """{'n': number of values, 'mean': their mean, 'median': their median}."""
    return {"n": len(xs), "mean": mean(xs), "median": median(xs)}


def headline(title, xs):
    """'<slug of title>: <n> values, mean <mean rounded to 2 places>'."""
    return f"{slugify(title)}: {len(xs)} values, mean {round(mean(xs), 2)}"
''', {
    "summary": FunctionInputs((([],), ([4],), ([1, 2, 9],)), lambda r: (_ints(r, 2, 8),)),
    "headline": FunctionInputs((("Q1 Sales", [1, 2, 3]), ("", [])), lambda r: (_text(r, 1, 4), _ints(r, 1, 6))),
}, (
    Bug("wrong_import", "summary", "from PKG.stats import mean, median",
        "from PKG.stats import median as mean, median"),
    Bug("wrong_import", "headline", "from PKG.text import slugify", "from PKG.text import slugfy"),
), needs=("stats", "text"))

MODULES: dict[str, ModuleTemplate] = {m.name: m for m in (STATS, TEXT, SEQS, MONEY, REPORT)}
PACKAGES = ("toolkit", "appcore", "helpers", "mylib")


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
        ready = [n for n in pending if all(d in loaded or d in failed for d in MODULES[n].needs)]
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
