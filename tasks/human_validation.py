"""Prefect tasks of the human_validation flow: judge a domain's sample, ask a reviewer, store labels, calibrate.

The reviewer's form is a Prefect ``RunInput``; the plain parts (parameters, sampling, the
item's markdown, checking a review) are in ``temper/judges/review.py``.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import Field, ValidationError, create_model

from temper.core.errors import DatasetError
from temper.core.settings import get_settings
from temper.data.catalog import load_catalog
from temper.data.datasets import load_dataset
from temper.judges import JudgeError
from temper.judges.calibration import CalibrationPolicy, agreement, log_calibration
from temper.judges.labels import write_labels
from temper.judges.params import parse_params
from temper.judges.review import (
    HumanValidationParams,
    JudgedItem,
    ReviewError,
    check_review,
    review_markdown,
    sample_records,
)
from temper.judges.rubric import Rubric
from temper.verifiers.registry import get_verifier


class ReviewInput(RunInput):
    """What a reviewer enters for one item in the Prefect UI.

    The form's ``score`` field carries the rubric's bounds, so the Prefect UI (and the API's
    resume validation) reject an out-of-range score before the flow sees it.
    """

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


@task(task_run_name="judge-{domain_name}")
def judge_domain(domain_name: str, params: HumanValidationParams) -> tuple[Rubric, list[JudgedItem], dict[str, str]]:
    """Sample and judge one domain's items: (rubric, judged items, skipped item -> reason)."""
    settings = get_settings()
    domain = load_catalog(settings.catalog_dir)[domain_name]
    verifier = get_verifier("judge", domain.verifier.params)
    frame = load_dataset(domain, settings).frame
    column = params.response_columns.get(domain_name, params.response_column)
    if column not in frame:
        raise DatasetError(f"domain {domain_name}: dataset has no response column {column!r} "
                           f"(columns: {', '.join(map(str, frame.columns))})")
    split = None if params.split == "all" else getattr(domain.split, params.split)
    records = sample_records(frame, params.items_per_domain, params.seed, domain.split.column, split, domain_name)
    items, skipped = [], {}
    for rec in records:
        item_id = str(rec.get("id", "?"))
        try:
            r = verifier.judge_record(rec, str(rec[column]))
        except JudgeError as e:
            skipped[item_id] = str(e)
            continue
        except KeyError as e:
            skipped[item_id] = f"record has no column {e.args[0]!r}"
            continue
        reference = str(rec[verifier.config.reference_field]) if verifier.config.reference_field else None
        items.append(JudgedItem(domain=domain_name, item_id=item_id,
                                prompt=verifier.config.prompt_template.format(**rec), response=str(rec[column]),
                                reference=reference, judge_score=r.score, judge_raw_score=r.raw_score,
                                rationale=r.rationale, digest=r.digest, judge_id=r.judge_id,
                                rubric_digest=r.rubric_digest))
    return verifier.rubric, items, skipped


@task(task_run_name="labels-{domain_name}")
def store_labels(domain_name: str, records: list[dict[str, Any]]) -> tuple[str, str, Any]:
    return write_labels(domain_name, records)


@task(task_run_name="calibrate-{domain_name}")
def calibrate(domain_name: str, rubric: Rubric, frame: Any, uri: str, sha256: str,
              policy: CalibrationPolicy) -> dict[str, Any]:
    domain = load_catalog(get_settings().catalog_dir)[domain_name]
    params, _ = parse_params(domain.verifier.params)
    effective = policy.merged(rubric.calibration, params.calibration)
    a = agreement(frame["judge_score"].tolist(), frame["human_score"].tolist(), rubric.scale)
    judge_ids = sorted(set(frame["judge_id"]))
    result = log_calibration(domain_name, a, effective, rubric_digest=rubric.digest, judge_id=judge_ids[0],
                             labels=frame, labels_uri=uri, labels_sha256=sha256)
    return result.to_dict()


def request_review(item: JudgedItem, rubric: Rubric, position: str, params: HumanValidationParams) -> tuple[int, str]:
    """Pause until a reviewer scores ``item`` in the UI; ReviewError when the input is unusable."""
    form = ReviewInput.for_item(rubric, review_markdown(item, rubric, position))
    try:
        review = pause_flow_run(wait_for_input=form, timeout=params.review_timeout_s,
                                poll_interval=params.poll_interval_s, key=f"review-{item.domain}-{item.item_id}")
    except ValidationError as e:
        raise ReviewError(f"item {item.domain}/{item.item_id}: review input rejected: "
                          f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    return check_review(review, item, rubric)
