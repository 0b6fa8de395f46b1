"""Calibration runs in MLflow (a real tracking server): logged per domain, read back as the latest, gated."""

from __future__ import annotations

import math
import uuid

import pytest

from temper.core.tag_names import TAG_CALIBRATION_STATUS, TAG_DOMAIN

RUBRIC = {"name": "t", "criteria": [{"name": "c", "description": "good"}], "scale": {"min": 1, "max": 5}}


def _labels(domain: str, judge: list[float], human: list[int]):
    from temper.judges.labels import label_record, write_labels
    from temper.judges.review import JudgedItem
    from temper.judges.rubric import Rubric

    rubric = Rubric.model_validate(RUBRIC)
    records = [label_record(JudgedItem(domain=domain, item_id=f"i{i}", prompt=f"p{i}", response=f"r{i}", reference=None,
                                       judge_score=j, judge_raw_score=1 + 4 * j, rationale="", digest="d" * 64,
                                       judge_id="judge-a", rubric_digest=rubric.digest), rubric, h, "", "flow-x")
               for i, (j, h) in enumerate(zip(judge, human))]
    return rubric, write_labels(domain, records)


def test_calibration_round_trip_latest_wins_and_feeds_the_gate(tracked):
    from mlflow.tracking import MlflowClient

    from temper.data.domain import Domain
    from temper.judges.calibration import (
        EXPERIMENT,
        CalibrationPolicy,
        agreement,
        apply_calibration_gate,
        calibration_status,
        log_calibration,
    )

    name = f"cal_{uuid.uuid4().hex[:8]}"
    policy = CalibrationPolicy(min_n=5)
    human = [1, 2, 3, 4, 5, 5, 1]
    good = [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 0.0]  # exact agreement
    rubric, (uri, sha, frame) = _labels(name, good, human)
    a = agreement(frame["judge_score"].tolist(), frame["human_score"].tolist(), rubric.scale)
    first = log_calibration(name, a, policy, rubric_digest=rubric.digest, judge_id="judge-a", labels=frame,
                            labels_uri=uri, labels_sha256=sha)
    assert first.status == "verified" and (first.n, first.spearman, first.kappa) == (7, pytest.approx(1.0), 1.0)

    run = MlflowClient(tracked).get_run(first.run_id)
    assert MlflowClient(tracked).get_experiment(run.info.experiment_id).name == EXPERIMENT
    assert run.data.tags[TAG_DOMAIN] == name and run.data.tags[TAG_CALIBRATION_STATUS] == "verified"
    assert run.data.metrics == {"n": 7.0, "spearman": pytest.approx(1.0), "kappa": 1.0}
    assert run.data.params["min_n"] == "5"
    (ds,) = run.inputs.dataset_inputs
    assert ds.dataset.name == f"human_labels/{name}" and ds.dataset.digest == sha[:32] and sha in ds.dataset.source

    domain = Domain.model_validate({
        "name": name, "description": "d", "contract": "c", "prompt_template": "{prompt}",
        "dataset": {"uri": "{store}/x.jsonl", "format": "jsonl"},
        "verifier": {"family": "judge", "params": {"rubric": RUBRIC, "judge": {"model": "/x", "judge_id": "judge-a"},
                                                   "calibration": {"min_n": 5}}}})
    statuses = calibration_status([name, "never_seen_domain"])
    assert statuses[name].status == "verified" and statuses[name].run_id == first.run_id
    assert statuses["never_seen_domain"].status == "missing"
    assert apply_calibration_gate([domain], statuses) == ({name: 1.0}, {})

    # A later, worse calibration replaces it: constant judge -> spearman and kappa undefined.
    rubric, (uri, sha, frame) = _labels(name, [0.5] * 7, human)
    a = agreement(frame["judge_score"].tolist(), frame["human_score"].tolist(), rubric.scale)
    second = log_calibration(name, a, policy, rubric_digest=rubric.digest, judge_id="judge-a", labels=frame,
                             labels_uri=uri, labels_sha256=sha)
    assert second.status == "unverified" and "spearman undefined" in second.reason
    latest = calibration_status([name])[name]
    assert latest.run_id == second.run_id and latest.status == "unverified" and math.isnan(latest.spearman)
    kept, excluded = apply_calibration_gate([domain], {name: latest})
    assert kept == {} and "spearman undefined" in excluded[name] and second.run_id in excluded[name]
