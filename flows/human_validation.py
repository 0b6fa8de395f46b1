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

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from tasks.human_validation import calibrate, judge_domain, request_review, store_labels
from temper.core.errors import TemperError
from temper.core.settings import get_settings
from temper.data.catalog import load_catalog, select_domains
from temper.judges.labels import label_record
from temper.judges.review import HumanValidationParams, ReviewError

__all__ = ["HumanValidationParams", "human_validation"]


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
