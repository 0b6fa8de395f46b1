"""human_validation: judged samples -> reviewer scores in the Prefect UI -> label dataset -> calibration.

    select open-ended (judge-family) domains -> per domain: sample N records, judge them
    (cached by digest) -> pause the flow once per item with a typed form (ReviewInput) ->
    labels pass their data contract and are stored, versioned by sha256 -> judge-human
    agreement logged to MLflow (experiment judge_calibration), the input of the RL gate

Nothing is scored silently: a judge output without a score, a record without the response
column, a broken rubric or an unusable review is skipped, named in the log and counted in
the result. A reviewer who never answers fails the run after ``review_timeout_s``.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.flow_runs import pause_flow_run
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from temper.errors import TemperError
from temper.judges.calibration import CalibrationPolicy
from temper.judges.review import JudgedItem, ReviewError, ReviewInput, check_review, review_markdown
from temper.judges.rubric import Rubric


class HumanValidationParams(BaseModel):
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


@task(task_run_name="judge-{domain_name}")
def judge_domain(domain_name: str, params: HumanValidationParams) -> tuple[Rubric, list[JudgedItem], dict[str, str]]:
    """Sample and judge one domain's items: (rubric, judged items, skipped item -> reason)."""
    from temper.catalog import load_catalog
    from temper.datasets import load_dataset
    from temper.errors import DatasetError
    from temper.judges import JudgeError
    from temper.judges.review import sample_records
    from temper.settings import get_settings
    from temper.verifiers.registry import get_verifier

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
    from temper.judges.labels import write_labels

    return write_labels(domain_name, records)


@task(task_run_name="calibrate-{domain_name}")
def calibrate(domain_name: str, rubric: Rubric, frame: Any, uri: str, sha256: str,
              policy: CalibrationPolicy) -> dict[str, Any]:
    from temper.catalog import load_catalog
    from temper.judges.calibration import agreement, log_calibration
    from temper.settings import get_settings
    from temper.verifiers.families.judge import parse_params

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


def _summary_markdown(result: dict[str, Any]) -> str:
    lines = ["| domain | judged | judge skipped | labelled | review skipped | n | spearman | kappa | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, d in result["domains"].items():
        c = d.get("calibration") or {}
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {name} | {d['judged']} | {len(d['judge_skipped'])} | {d['labelled']} | "
                     f"{len(d['review_skipped'])} | {c.get('n', '-')} | {fmt(c.get('spearman'))} | "
                     f"{fmt(c.get('kappa'))} | {c.get('status', '-')} |")
    for name, why in result["skipped_domains"].items():
        lines.append(f"\nSkipped domain **{name}**: {why}")
    return "\n".join(lines)


@flow(name="human_validation", log_prints=True)
def human_validation(params: HumanValidationParams = HumanValidationParams()) -> dict[str, Any]:
    from temper.catalog import load_catalog, select_domains
    from temper.settings import get_settings

    logger = get_run_logger()
    run_id = flow_run.get_id() or "local"
    catalog = load_catalog(get_settings().catalog_dir)
    chosen = select_domains(catalog, params.domains)
    result: dict[str, Any] = {"domains": {}, "skipped_domains": {}}
    for d in chosen:
        if d.verifier.family != "judge":
            if params.domains:
                result["skipped_domains"][d.name] = f"verifier family {d.verifier.family!r} is not 'judge'"
            continue
        try:
            rubric, items, judge_skipped = judge_domain(d.name, params)
        except TemperError as e:
            logger.error("domain %s skipped: %s", d.name, e)
            result["skipped_domains"][d.name] = str(e)
            continue
        for item_id, why in judge_skipped.items():
            logger.warning("domain %s: judge skipped item %s: %s", d.name, item_id, why)
        from temper.judges.labels import label_record

        labels, review_skipped = [], {}
        for i, item in enumerate(items, 1):
            try:
                score, comment = request_review(item, rubric, f"{i}/{len(items)}", params)
            except ReviewError as e:
                logger.warning("%s", e)
                review_skipped[item.item_id] = str(e)
                continue
            labels.append(label_record(item, rubric, score, comment, str(run_id)))
        entry: dict[str, Any] = {"judged": len(items), "judge_skipped": judge_skipped, "labelled": len(labels),
                                 "review_skipped": review_skipped, "labels_uri": None, "labels_sha256": None,
                                 "calibration": None}
        result["domains"][d.name] = entry
        if not labels:
            logger.warning("domain %s: no labels collected; nothing stored or calibrated", d.name)
            continue
        try:
            uri, sha, frame = store_labels(d.name, labels)
        except TemperError as e:
            result["skipped_domains"][d.name] = str(e)
            continue
        entry.update(labels_uri=uri, labels_sha256=sha)
        if params.calibrate:
            entry["calibration"] = calibrate(d.name, rubric, frame, uri, sha, params.policy)
            c = entry["calibration"]
            logger.info("domain %s: judge %s (n=%d, spearman=%s, kappa=%s) %s", d.name, c["status"], c["n"],
                        c["spearman"], c["kappa"], c["reason"])
    create_markdown_artifact(markdown=_summary_markdown(result), key="human-validation",
                             description="Human validation of judge domains")
    return result
