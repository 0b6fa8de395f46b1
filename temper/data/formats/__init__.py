"""Adapters from public benchmark formats to temper's domain dataset records.

Each adapter returns plain dict records with the starter schema of its verifier family
(``id``, ``split``, ``reference`` plus the family's columns), ready for ``pandas.DataFrame``
and the domain's data contract. Splits are assigned by a stable hash of the id, so the same
source always gives the same split.
"""

from __future__ import annotations

import hashlib


def stable_split(record_id: str, eval_fraction: float) -> str:
    """'eval' for a fixed ``eval_fraction`` share of ids, independent of order and of the run."""
    h = int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:8], "big") / 2**64
    return "eval" if h < eval_fraction else "train"
