"""docs/ARCHITECTURE.md names every module, so a reader finds each one from that page."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("temper", "data_contracts", "infra", "workloads", "tasks", "flows", "benchmarks")


def _modules() -> list[Path]:
    return [p for room in ROOMS for p in sorted((REPO / room).rglob("*.py")) if p.name != "__init__.py"]


def _named(module: Path, lines: list[str], shared_name: bool) -> bool:
    """Its path; or its file name in backticks, on a line that names its folder too when another
    module has the same file name (``train.py`` alone names ``workloads/train.py``, not
    ``benchmarks/train.py``)."""
    path = str(module.relative_to(REPO))
    folder = str(module.parent.relative_to(REPO)) + "/"
    return any(path in line or (f"`{module.name}`" in line and (not shared_name or folder in line))
               for line in lines)


def test_every_module_is_named_in_the_architecture_page() -> None:
    lines = (REPO / "docs" / "ARCHITECTURE.md").read_text().splitlines()
    modules = _modules()
    names = Counter(p.name for p in modules)
    unnamed = [str(p.relative_to(REPO)) for p in modules if not _named(p, lines, names[p.name] > 1)]
    assert not unnamed, f"docs/ARCHITECTURE.md does not name: {unnamed}"
