"""The human side of calibration: the session's parameters, sampling judged items, what a reviewer sees.

Reviewers are blind to the judge: the item shows the rubric, the task and the response,
never the judge's score or rationale, so a label measures the response and not the judge.
The Prefect form itself (``ReviewInput``) lives in ``tasks/human_validation.py``, with the
orchestrator; its ``score`` field carries the rubric's bounds, and ``check_review`` repeats the
check in the flow, so an input that slips past is skipped and counted.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from temper.core.errors import TemperError
from temper.judges.calibration import CalibrationPolicy
from temper.judges.rubric import Rubric


class ReviewError(TemperError):
    """A reviewer's input cannot be used as a label (out of range, missing)."""


class HumanValidationParams(BaseModel):
    """The parameters of one review session: the human_validation flow's form in the Prefect UI."""

    model_config = ConfigDict(extra="forbid")

    domains: list[str] | None = Field(default=None, description="Names or globs; None = every judge-family domain.")
    items_per_domain: int = Field(default=20, ge=1, le=1000,
                                  description="Judged items each reviewer session scores per domain.")
    seed: int = Field(default=0, description="Seed of the item sample: same data + seed, same items.")
    split: Literal["eval", "train", "all"] = Field(default="eval", description="Split the items are sampled from.")
    response_column: str = Field(default="candidate",
                                 description="Record column holding the response to judge and review.")
    response_columns: dict[str, str] = Field(default_factory=dict,
                                             description="Per-domain override of response_column.")
    review_timeout_s: int = Field(default=86400, ge=1, description="How long one item waits for its reviewer.")
    poll_interval_s: int = Field(default=10, ge=1, description="How often the paused flow checks for the review.")
    calibrate: bool = Field(default=True, description="Log judge-human agreement to MLflow after the reviews.")
    policy: CalibrationPolicy = Field(default_factory=CalibrationPolicy, description="Default calibration thresholds.")


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
