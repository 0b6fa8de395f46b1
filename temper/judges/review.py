"""The human side of calibration: sampling judged items and the Prefect UI form a reviewer fills in.

Reviewers are blind to the judge: the form shows the rubric, the task and the response,
never the judge's score or rationale, so a label measures the response and not the judge.
The form's ``score`` field carries the rubric's bounds, so the Prefect UI (and the API's
resume validation) reject an out-of-range score before the flow sees it; ``check_review``
repeats the check in the flow, so an input that slips past is skipped and counted.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
from prefect.input import RunInput
from pydantic import Field, create_model

from temper.errors import TemperError
from temper.judges.rubric import Rubric


class ReviewError(TemperError):
    """A reviewer's input cannot be used as a label (out of range, missing)."""


class ReviewInput(RunInput):
    """What a reviewer enters for one item in the Prefect UI."""

    score: int = Field(description="Your score for the response on the rubric scale.")
    comment: str | None = Field(default=None, description="Optional: why, or what is wrong with the item.")

    @classmethod
    def for_item(cls, rubric: Rubric, description: str) -> type["ReviewInput"]:
        """The form for one item: score bounded to the rubric's scale, the item shown as markdown."""
        s = rubric.scale
        model = create_model("ReviewInput", __base__=cls, score=(int, Field(
            ge=s.min, le=s.max, description=f"Your score, {s.min} (worst) to {s.max} (best), per the rubric above.")))
        model._description = description
        return model


@dataclass(frozen=True)
class JudgedItem:
    domain: str
    item_id: str
    prompt: str
    response: str
    reference: str | None
    judge_score: float
    judge_raw_score: float
    rationale: str
    digest: str
    judge_id: str
    rubric_digest: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_records(frame: pd.DataFrame, n: int, seed: int, split_column: str, split_value: str | None,
                   domain: str) -> list[dict[str, Any]]:
    """``n`` records of one split, the same ones for the same (data, seed): a session is reproducible."""
    rows = frame if split_value is None else frame[frame[split_column] == split_value]
    records = sorted(rows.to_dict(orient="records"), key=lambda r: str(r.get("id", "")))
    rng = random.Random(f"review:{domain}:{seed}")
    return rng.sample(records, min(n, len(records)))


def review_markdown(item: JudgedItem, rubric: Rubric, position: str) -> str:
    s = rubric.scale
    lines = [f"### Review {position}: `{item.domain}` item `{item.item_id}`", "",
             f"**Rubric `{rubric.name}`**: {rubric.description}".rstrip(), ""]
    lines += [f"- **{c.name}**: {c.description}" for c in rubric.criteria]
    lines += ["", f"**Scale** {s.min}..{s.max}"]
    lines += [f"- {k}: {v}" for k, v in sorted(s.labels.items())]
    lines += ["", "**Task**", "", "```text", item.prompt, "```"]
    if item.reference is not None:
        lines += ["", "**Reference**", "", "```text", item.reference, "```"]
    lines += ["", "**Response to score**", "", "```text", item.response, "```"]
    return "\n".join(lines)


def check_review(review: Any, item: JudgedItem, rubric: Rubric) -> tuple[int, str]:
    """(score, comment) or ReviewError naming the item."""
    score = getattr(review, "score", None)
    if isinstance(score, bool) or not isinstance(score, int):
        raise ReviewError(f"item {item.domain}/{item.item_id}: reviewer score {score!r} is not an integer")
    if not rubric.scale.min <= score <= rubric.scale.max:
        raise ReviewError(f"item {item.domain}/{item.item_id}: reviewer score {score} is outside the rubric scale "
                          f"{rubric.scale.min}..{rubric.scale.max}")
    return score, (getattr(review, "comment", None) or "")
