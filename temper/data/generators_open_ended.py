"""Deterministic open-ended example data: short business news items and one-sentence summaries.

There is no single right summary, so the domain is scored by a judge, not a matcher. Each
record carries the ``reference`` summary (the SFT target) and a ``candidate`` of a designed
quality (``candidate_quality`` 1..5: faithful, missing the cause, vague, wrong number,
off-topic), so a human-validation session sees the whole range of the rubric and judge-human
agreement is measurable. Same (rows, seed) -> same bytes, like every starter generator.
"""

from __future__ import annotations

import random
from typing import Any

import pandas as pd

from temper.data.frames import seeded_frame

_COMPANIES = ["Acme Tools", "Blue River Foods", "Nordlicht Media", "Sierra Parts", "Kato Electric", "Lumen Bank"]
_METRICS = ["revenue", "operating profit", "net sales", "orders"]
_REASONS = ["stronger demand in Asia", "higher prices", "a weak holiday season", "a factory outage",
            "new subscription plans", "lower energy costs"]
_EXTRAS = ["Its shares closed unchanged.", "The chief executive will step down next year.",
           "It kept its full-year forecast.", "Analysts had expected a smaller change."]


def _item(rng: random.Random) -> dict[str, Any]:
    company, metric, reason = rng.choice(_COMPANIES), rng.choice(_METRICS), rng.choice(_REASONS)
    value, pct, quarter = rng.randint(20, 900), rng.randint(2, 40), f"Q{rng.randint(1, 4)}"
    up = rng.random() < 0.5
    verb = "rose" if up else "fell"
    document = (f"{company} said its {metric} {verb} {pct}% to {value} million euros in {quarter} compared with a "
                f"year earlier. The company attributed the change to {reason}. {rng.choice(_EXTRAS)}")
    reference = f"{company}'s {metric} {verb} {pct}% to {value} million euros in {quarter} because of {reason}."
    wrong = pct + rng.randint(5, 30)
    candidates = {
        5: reference,
        4: f"{company} reported that {metric} {verb} {pct}% in {quarter}.",
        3: f"{company} published results for {quarter} and {metric} changed.",
        2: f"{company}'s {metric} {'fell' if up else 'rose'} {wrong}% in {quarter}.",
        1: f"{rng.choice([c for c in _COMPANIES if c != company])} opened a new office.",
    }
    quality = rng.randint(1, 5)
    return {"document": document, "reference": reference, "candidate": candidates[quality],
            "candidate_quality": quality}


def summaries(rows: int, seed: int = 0, eval_fraction: float = 0.1) -> pd.DataFrame:
    return seeded_frame("sum", rows, seed, eval_fraction, lambda rng, _: _item(rng))
