"""The record frame a seeded starter generator returns: ids ``<prefix>-<seed>-<i>`` and each
record's split drawn from the same random stream as its columns, so same (rows, seed) -> same bytes.

Apart from ``generators.py`` (the list of generators) so that a generator in a module of its own
(``generators_open_ended``) builds its frame without importing the list that names it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pandas as pd

GeneratorFn = Callable[[random.Random, int], dict[str, Any]]


def seeded_frame(prefix: str, rows: int, seed: int, eval_fraction: float, make: GeneratorFn) -> pd.DataFrame:
    rng = random.Random(f"{prefix}:{seed}")
    records = []
    for i in range(rows):
        rec = {"id": f"{prefix}-{seed}-{i:06d}", **make(rng, i)}
        rec["split"] = "eval" if rng.random() < eval_fraction else "train"
        records.append(rec)
    return pd.DataFrame.from_records(records)
