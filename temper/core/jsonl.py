"""Reading a JSON-lines file of objects with errors a person can act on: the path, the line, what is wrong.

Records to verify and recorded trajectories are both files people hand to the CLI; each caller
raises its own error type, so the message lands in the command's one-line error as it would anyway.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temper.core.errors import TemperError


def json_objects(path: Path, error: type[TemperError], what: str = "a JSON object") -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of ``path``; ``error`` naming the path and line for an
    unreadable file, a line that is not JSON, or a value that is not an object (``what`` says what it should be)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise error(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(value, dict):
            raise error(f"{path}:{n}: expected {what}, got {type(value).__name__}")
        out.append((n, value))
    return out
