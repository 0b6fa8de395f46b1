"""YAML files people edit (domains, contracts, rubrics, training configs, flow parameters) into
pydantic models, with one error format.

Every failure names the file (and the YAML line when there is one), the field and the reason,
as the config's own error class, so a CLI prints one clear line. A model with a
``source_file`` field gets the file it came from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from temper.core.errors import TemperError, describe_validation_error

M = TypeVar("M", bound=BaseModel)


# Limits for files people edit (no dataset goes through here): a config past them is hostile or a
# mistake, and either way must fail with a line, not exhaust memory or the stack.
MAX_BYTES = 1 << 20
MAX_DEPTH = 50
MAX_NODES = 100_000  # counted through aliases, so a "billion laughs" document stops here
# libyaml's safe loader when PyYAML was built with it (its wheels are): the same documents, parsed ~12x faster
# (the shipped catalog's 21 files: 106 -> 8 ms, composed and loaded), which a flow that reads its catalog in
# several tasks pays each time. The pure-Python loader where libyaml is missing.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path | str, error: type[TemperError], noun: str) -> Any:
    try:
        size = Path(path).stat().st_size
        if size > MAX_BYTES:
            raise error(f"{path}: {noun} file is {size} bytes, more than the {MAX_BYTES} a config may have")
        loader = SAFE_LOADER(Path(path).read_text())
        try:  # parsed once: the node tree is checked before anything is built from it (as yaml.load builds it)
            node = loader.get_single_node()
            _check_shape(node, path, error, noun)
            return None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except RecursionError:
        raise error(f"{path}: {noun} is nested too deeply (more than {MAX_DEPTH} levels)") from None
    except yaml.YAMLError as e:
        if "maximum nesting depth" in str(getattr(e, "problem", "")):  # libyaml's own limit (1000 levels)
            raise error(f"{path}: {noun} is nested too deeply (more than {MAX_DEPTH} levels)") from None
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise error(f"{path}:{where} malformed YAML: {getattr(e, 'problem', e)}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {noun}: {e.strerror}") from None


def _check_shape(root: yaml.Node | None, path, error: type[TemperError], noun: str) -> None:
    """Depth and size of the document as it would expand, counted without expanding it."""
    stack, seen = [(root, 1)], 0
    while stack:
        node, depth = stack.pop()
        if node is None:
            continue
        seen += 1
        if depth > MAX_DEPTH:
            raise error(f"{path}: {noun} is nested too deeply (more than {MAX_DEPTH} levels)")
        if seen > MAX_NODES:
            raise error(f"{path}: {noun} expands to more than {MAX_NODES} values (aliases included)")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend((v, depth + 1) for pair in node.value for v in pair)


def parse_config(raw: Any, model: type[M], source: object, error: type[TemperError], noun: str) -> M:
    if not isinstance(raw, dict):
        raise error(f"{source}: expected a mapping of {noun} fields, got {type(raw).__name__}")
    try:
        parsed = model.model_validate(raw)
    except ValidationError as e:
        raise error(describe_validation_error(source, e)) from None
    if "source_file" in type(parsed).model_fields:
        parsed.source_file = str(source)
    return parsed


def load_config(path: Path | str, model: type[M], error: type[TemperError], noun: str) -> M:
    """One YAML file as ``model``; ``noun`` ('domain', 'contract', ...) words the errors."""
    return parse_config(read_yaml(path, error, noun), model, path, error, noun)
