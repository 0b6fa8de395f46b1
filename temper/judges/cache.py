"""Judge verdicts cached by digest: re-scoring the same (rubric, prompt, response, judge) is free.

One sqlite file under TEMPER_HOME. A key is the sha256 of the four parts, so a cached verdict
is exactly reproducible and never stale: any change to any part is a different key.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


def cache_key(rubric_digest: str, prompt: str, response: str, judge_id: str) -> str:
    h = hashlib.sha256()
    for part in (rubric_digest, prompt, response, judge_id):
        h.update(len(part.encode()).to_bytes(8, "big") + part.encode())  # length-prefixed: no ambiguity
    return h.hexdigest()


class JudgeCache:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self.hits = self.misses = 0

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock, self._connect() as db:
            row = db.execute("SELECT value FROM verdicts WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, value: dict[str, Any]) -> None:
        with self._lock, self._connect() as db:
            db.execute("INSERT OR REPLACE INTO verdicts (key, value) VALUES (?, ?)", (key, json.dumps(value)))
