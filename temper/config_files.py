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

from temper.errors import TemperError, describe_validation_error

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: Path | str, error: type[TemperError], noun: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise error(f"{path}:{where} malformed YAML: {getattr(e, 'problem', e)}") from None
    except OSError as e:
        raise error(f"{path}: cannot read {noun}: {e.strerror}") from None


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
