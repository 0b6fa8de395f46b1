"""The judge cache: one JSON file per digest under ``<TEMPER_HOME>/judge_cache``.

Judging is greedy, so (rubric, prompt, response, judge, decoding) fully determines the
output: storing it by the sha256 of those inputs makes a re-score free and bit-identical,
across processes and runs. The raw output is stored, not the parsed score, so a parser fix
applies to cached items too. Files are written to a temporary name and renamed, so
concurrent judges (GRPO ranks, Prefect tasks) never read half an entry.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class JudgeCache:
    def __init__(self, root: Path | str | None = None) -> None:
        if root is None:
            # lazy: pydantic_settings (130 ms), via settings, would load in fast unit tests (test_judges_calibration.py)
            from temper.core.settings import get_settings

            root = get_settings().home / "judge_cache"
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        return self.root / digest[:2] / f"{digest}.json"

    def get(self, digest: str) -> dict[str, Any] | None:
        path = self.path(digest)
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("judge cache entry %s is unreadable (%s); judging again", path, e)
            return None
        return entry if isinstance(entry, dict) and entry.get("digest") == digest else None

    def put(self, digest: str, entry: dict[str, Any]) -> Path:
        path = self.path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:8]}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({**entry, "digest": digest}, f, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path
