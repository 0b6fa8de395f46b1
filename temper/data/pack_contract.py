"""A pack's contract template: read, checked once against what the pack can fill in and what its rows
hold, then filled in per expanded domain.

Why checked before any data is: a template mistake otherwise surfaces as every row of every domain
failing its contract, which reads as bad data. A misspelt rule column (``with_column: tsak``) fails
every row of that rule; an unknown ``${tsk}`` is left as literal text (``string.Template.safe_substitute``
must leave regex ``$`` alone) and fails every row of ``allowed``; a column the rows do not have fails
inside Great Expectations (``list index out of range``). So: one line naming the template file, the
field and what is wrong, before the first domain is built.
"""

from __future__ import annotations

import difflib
import string
from pathlib import Path
from typing import Any

from temper.core.errors import CatalogError

#: What ``fill`` substitutes, per domain (see ``temper.data.packs.expand_pack``).
PLACEHOLDERS = ("name", "pack", "task", "tier", "rows", "eval_min", "eval_max")
#: The columns of every row a source's generator writes (``temper/data/packs_<source>.py``): all a
#: template can check.
SOURCE_COLUMNS = {"reasoning_gym": ("id", "task", "tier", "question", "answer", "reference", "entry", "split")}


def load_template(name: str, pack_file: Path, contracts_dir: Path, source: str) -> dict[str, Any]:
    """The template ``<contracts_dir>/templates/<name>.yaml``, checked (``check_template``)."""
    # lazy: yaml (11 ms), via config_files, would load in fast unit tests (test_generators.py)
    from temper.core.config_files import read_yaml

    tpl = contracts_dir / "templates" / f"{name}.yaml"
    if not tpl.is_file():
        raise CatalogError(f"{pack_file}: field 'contract_template': no template {tpl}")
    raw = read_yaml(tpl, CatalogError, "contract template")
    if not isinstance(raw, dict):
        raise CatalogError(f"{tpl}: expected a mapping of contract fields")
    check_template(raw, tpl, SOURCE_COLUMNS[source])
    return raw


def _near(word: str, known: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _strings(node: Any, field: str):
    """(field path, string) of every string value under ``node``: 'columns.task.allowed[0]'."""
    if isinstance(node, str):
        yield field, node
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{field}[{i}]")
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{field}.{k}" if field else str(k))


def check_template(raw: dict[str, Any], tpl: Path, columns: tuple[str, ...]) -> None:
    """Every placeholder is one ``fill`` knows; every column, rule column and split column is one the rows have."""
    where = f"{tpl}: contract template {tpl.stem!r}"
    for field, text in _strings(raw, ""):
        for m in string.Template.pattern.finditer(text):
            name = m.group("named") or m.group("braced")
            if name is not None and name not in PLACEHOLDERS:
                raise CatalogError(f"{where}: field '{field}': unknown placeholder ${{{name}}}{_near(name, PLACEHOLDERS)}; "
                                   f"known: {', '.join(PLACEHOLDERS)}")
    have = f"the rows have {', '.join(columns)}"
    for column in raw.get("columns") or {}:
        if column not in columns:
            raise CatalogError(f"{where}: field 'columns.{column}': no such column{_near(str(column), columns)}; {have}")
    for i, rule in enumerate(raw.get("rules") or []):
        for key in ("column", "with_column"):
            value = rule.get(key) if isinstance(rule, dict) else None
            if value is not None and value not in columns:
                raise CatalogError(f"{where}: field 'rules[{i}].{key}': no such column {value!r}"
                                   f"{_near(str(value), columns)}; {have}")
    split = raw.get("split")
    if isinstance(split, dict) and split.get("column", "split") not in columns:
        raise CatalogError(f"{where}: field 'split.column': no such column {split['column']!r}"
                           f"{_near(str(split['column']), columns)}; {have}")


def fill(node: Any, values: dict[str, str]) -> Any:
    """The template with one domain's values (``safe_substitute``: a regex's ``$`` stays as it is)."""
    if isinstance(node, str):
        return string.Template(node).safe_substitute(values)
    if isinstance(node, list):
        return [fill(v, values) for v in node]
    if isinstance(node, dict):
        return {k: fill(v, values) for k, v in node.items()}
    return node
