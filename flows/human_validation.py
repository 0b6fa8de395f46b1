"""human_validation: people score judged items in the Prefect UI; the judge is calibrated on them.

Per open-ended (judge-scored) domain: sample N eval records, have the judge score each
record's response, then pause the flow with a typed form (``ReviewInput``) per item. A
reviewer fills it in the Prefect UI (or through the API: ``resume_flow_run(id, run_input=
...)``) and the flow continues. A score outside the rubric's scale is reported naming the
item, skipped and counted, never stored. Labels become a versioned dataset (its sha256 in
the file name) checked by the ``human_labels`` contract, and the judge-human agreement is
logged to MLflow, where the post-training flow's calibration gate reads it.
"""

from __future__ import annotations

import random

from prefect import flow, get_run_logger
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import BaseModel, ConfigDict, Field


class ReviewInput(RunInput):
    score: int = Field(description="Your score on the rubric's scale (shown in the description).")
    comment: str = Field(default="", description="Optional: why.")
    reviewer: str = Field(default="reviewer", description="Who scored it.")


class HumanValidationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domains: list[str] | None = Field(default=None, description="Judge-scored domains (names/globs); None = all.")
    samples_per_domain: int = Field(default=10, ge=1, description="Items each reviewer session scores per domain.")
    response_field: str = Field(default="response", description="Record column holding the response to judge.")
    review_timeout_s: int = Field(default=24 * 3600, ge=10, description="How long one item waits for a reviewer.")
    seed: int = Field(default=0, description="Which items are sampled.")


def _item_markdown(domain: str, item_id: str, prompt: str, response: str, judge_score: int, rubric) -> str:
    criteria = "\n".join(f"- {c}" for c in rubric.criteria)
    return (f"### {domain} / {item_id}\n\n**Task:** {rubric.task}\n\n**Criteria:**\n{criteria}\n\n"
            f"**Prompt:**\n\n{prompt}\n\n**Response:**\n\n{response}\n\n"
            f"Score from {rubric.scale_min} to {rubric.scale_max}. (The judge said {judge_score}.)")


def store_labels(domain: str, rows: list[dict]):
    """Write the labels as a content-addressed dataset, check its contract; returns (uri, digest, report)."""
    import hashlib

    import pandas as pd

    from data_contracts.model import load_contracts
    from data_contracts.runner import GXRunner
    from infra.storage import join, write_bytes_atomic
    from temper.datasets import serialize_dataset
    from temper.settings import get_settings

    settings = get_settings()
    frame = pd.DataFrame(rows, columns=["id", "domain", "item_id", "response", "judge_score", "human_score",
                                        "reviewer", "comment"])
    data = serialize_dataset(frame, "jsonl")
    digest = hashlib.sha256(data).hexdigest()
    uri = join(settings.resolved_storage_root, "human_labels", domain, f"{digest[:16]}.jsonl")
    contract = load_contracts(settings.resolved_contracts_dir)["human_labels"]
    report = GXRunner().validate(f"human_labels-{domain}", contract, frame, dataset_uri=uri, digest=digest)
    if report.success:
        write_bytes_atomic(uri, data)
    return uri, digest, frame, report


@flow(name="human_validation", log_prints=True)
def human_validation(params: HumanValidationParams = HumanValidationParams()) -> dict:
    from infra import lineage
    from temper.catalog import load_catalog, select_domains
    from temper.datasets import load_dataset
    from temper.judges.calibration import agreement, log_calibration
    from temper.settings import get_settings
    from temper.verifiers.registry import get_verifier

    logger = get_run_logger()
    settings = get_settings()
    domains = [d for d in select_domains(load_catalog(settings.catalog_dir), params.domains)
               if d.verifier.family == "judge"]
    summary: dict[str, dict] = {}
    for d in domains:
        verifier = get_verifier(d.verifier.family, d.verifier.params)
        rubric = verifier.rubric
        frame = load_dataset(d, settings).frame
        records = frame[frame[d.split.column] == d.split.eval].to_dict(orient="records")
        picked = random.Random(f"{params.seed}:{d.name}").sample(records, min(params.samples_per_domain, len(records)))
        rows, skipped = [], []
        for r in picked:
            item_id, response = str(r["id"]), str(r.get(params.response_field, ""))
            verdict = verifier.score(r, response)
            if verdict is None:
                skipped.append(f"{d.name}/{item_id}: judge gave no score")
                continue
            judge_score = verdict.details["score"]
            answer = pause_flow_run(
                wait_for_input=ReviewInput.with_initial_data(
                    description=_item_markdown(d.name, item_id, d.render_prompt(r), response, judge_score, rubric)),
                timeout=params.review_timeout_s, key=f"review-{d.name}-{item_id}")
            if not rubric.scale_min <= answer.score <= rubric.scale_max:
                msg = (f"{d.name}/{item_id}: reviewer score {answer.score} outside the scale "
                       f"{rubric.scale_min}..{rubric.scale_max}; item skipped")
                logger.error(msg)
                skipped.append(msg)
                continue
            rows.append({"id": f"{d.name}-{item_id}-{answer.reviewer}", "domain": d.name, "item_id": item_id,
                         "response": response, "judge_score": int(judge_score), "human_score": answer.score,
                         "reviewer": answer.reviewer, "comment": answer.comment})
        result = agreement(d.name, [x["judge_score"] for x in rows], [x["human_score"] for x in rows],
                           scale=(rubric.scale_min, rubric.scale_max), threshold=rubric.agreement_threshold)
        entry = {"labels": len(rows), "skipped": skipped, "spearman": result.spearman, "kappa": result.kappa,
                 "verified": result.verified}
        if rows:
            uri, digest, labels, report = store_labels(d.name, rows)
            if not report.success:
                raise ValueError(f"{d.name}: human labels violate the human_labels contract: {report.failures}")
            run_id = log_calibration(result, labels_digest=digest)
            with lineage.resume_run(run_id):
                lineage.log_dataset(f"human_labels-{d.name}", labels, uri, digest, context="calibration")
            lineage.close_run(run_id)
            entry.update(labels_uri=uri, labels_sha256=digest, mlflow_run_id=run_id)
        logger.info("%s: %d labels, %d skipped, Spearman %.2f, kappa %.2f -> %s", d.name, len(rows), len(skipped),
                    result.spearman, result.kappa, "verified" if result.verified else "unverified")
        summary[d.name] = entry
    return summary
