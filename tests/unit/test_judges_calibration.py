"""Agreement statistics on hand-computed labels, the calibration gate, the review form and the labels contract."""

from __future__ import annotations

import math

import pytest

from temper.data.domain import Domain
from temper.judges.calibration import (CalibrationPolicy, CalibrationResult, agreement, apply_calibration_gate,
                                       shortfalls)
from temper.judges.rubric import Rubric, Scale
from temper.judges.stats import cohen_kappa, spearman

RUBRIC = {"name": "t", "criteria": [{"name": "c", "description": "good"}], "scale": {"min": 1, "max": 5}}


# ---- statistics (expected values computed by hand, see comments) -------------------------------

def test_spearman_without_ties():
    # d = [0, 0, 0, 1, -1]: rho = 1 - 6 * 2 / (5 * (25 - 1)) = 0.9
    assert spearman([1, 2, 3, 5, 4], [1, 2, 3, 4, 5]) == pytest.approx(0.9)


def test_spearman_with_ties_uses_average_ranks():
    # ranks a = [1, 2.5, 2.5, 4], b = [1, 3.5, 2, 3.5]; deviations from 2.5: a = [-1.5, 0, 0, 1.5],
    # b = [-1.5, 1, -0.5, 1]; cov = 2.25 + 1.5 = 3.75, var_a = 4.5, var_b = 4.5 -> rho = 3.75 / 4.5
    assert spearman([1, 2, 2, 3], [1, 3, 2, 3]) == pytest.approx(3.75 / 4.5)


def test_kappa_hand_computed():
    # 5 items, 3 agree: po = 0.6; each category once per rater: pe = 5 * (1/5)^2 = 0.2 -> (0.6 - 0.2) / 0.8
    assert cohen_kappa([1, 2, 3, 5, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) == pytest.approx(0.5)
    # po = 3/4; marginals a = (1/4, 2/4, 1/4), b = (1/4, 1/4, 2/4): pe = 5/16 -> (12/16 - 5/16) / (11/16) = 7/11
    assert cohen_kappa([1, 2, 2, 3], [1, 3, 2, 3], [1, 2, 3]) == pytest.approx(7 / 11)
    assert cohen_kappa([1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5]) == pytest.approx(1.0)
    assert cohen_kappa([1, 2], [2, 1], [1, 2]) == pytest.approx(-1.0)


def test_undefined_agreement_is_nan_not_perfect():
    assert math.isnan(spearman([3, 3, 3], [1, 2, 3]))
    assert math.isnan(spearman([1], [1]))
    assert math.isnan(cohen_kappa([3, 3], [3, 3], [1, 2, 3]))
    with pytest.raises(ValueError, match=r"values \[7\] are not among the categories"):
        cohen_kappa([7], [1], [1, 2, 3])


def test_against_scipy_and_sklearn_when_installed():
    stats = pytest.importorskip("scipy.stats")
    metrics = pytest.importorskip("sklearn.metrics")
    import random

    rng = random.Random(0)
    a = [rng.randint(1, 5) for _ in range(60)]
    b = [min(5, max(1, x + rng.choice([-1, 0, 0, 1]))) for x in a]
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert cohen_kappa(a, b, [1, 2, 3, 4, 5]) == pytest.approx(metrics.cohen_kappa_score(a, b))


def test_agreement_bins_judge_scores_to_scale_points():
    scale = Scale(min=1, max=5)
    judge = [0.0, 0.25, 0.5, 1.0, 0.75]  # -> points 1, 2, 3, 5, 4
    a = agreement(judge, [1, 2, 3, 4, 5], scale)
    assert (a.n, a.spearman, a.kappa) == (5, pytest.approx(0.9), pytest.approx(0.5))


def test_shortfalls_name_every_missed_threshold():
    policy = CalibrationPolicy(min_spearman=0.95, min_kappa=0.4, min_n=6)
    a = agreement([0.0, 0.25, 0.5, 1.0, 0.75], [1, 2, 3, 4, 5], Scale())
    assert shortfalls(a, policy) == ["n=5 < min_n=6", "spearman=0.900 < 0.95"]
    assert shortfalls(a, CalibrationPolicy(min_n=5)) == []
    nan = agreement([0.5] * 5, [1, 2, 3, 4, 5], Scale())
    assert "spearman undefined" in shortfalls(nan, CalibrationPolicy(min_n=2))[0]


# ---- the gate ---------------------------------------------------------------------------------

def _domain(name: str, family: str = "judge", calibration: dict | None = None, rubric: dict | None = None,
            judge: dict | None = None, ratio: float = 0.5) -> Domain:
    params = {"rubric": rubric or RUBRIC, "judge": judge or {"model": "/nowhere", "judge_id": "judge-a"}}
    if calibration:
        params["calibration"] = calibration
    verifier = {"family": family, "params": params if family == "judge" else {}}
    return Domain.model_validate({"name": name, "description": "d", "contract": "c", "sampling_ratio": ratio,
                                  "dataset": {"uri": "{store}/x.jsonl", "format": "jsonl"},
                                  "prompt_template": "{prompt}", "verifier": verifier})


def _result(name: str, spearman_: float, kappa: float, n: int = 30, rubric: dict | None = None,
            judge_id: str = "judge-a") -> CalibrationResult:
    return CalibrationResult(domain=name, status="verified", n=n, spearman=spearman_, kappa=kappa, run_id=f"run-{name}",
                             rubric_digest=Rubric.model_validate(rubric or RUBRIC).digest, judge_id=judge_id)


def test_gate_passes_non_judge_and_verified_domains_and_excludes_the_rest():
    domains = [_domain("math", family="numeric", ratio=0.4), _domain("good"), _domain("weak"), _domain("never"),
               _domain("few")]
    statuses = {"good": _result("good", 0.8, 0.7), "weak": _result("weak", 0.3, 0.7), "few": _result("few", 0.9, 0.9, n=5),
                "math": _result("math", -1, -1)}  # a stray calibration of a non-judge domain changes nothing
    kept, excluded = apply_calibration_gate(domains, statuses)
    assert kept == {"math": 0.4, "good": 0.5}
    assert set(excluded) == {"weak", "never", "few"}
    assert "spearman=0.300 < 0.5" in excluded["weak"] and "run-weak" in excluded["weak"]
    assert excluded["never"] == "judge never calibrated against human labels"
    assert "n=5 < min_n=20" in excluded["few"]


def test_gate_downweights_when_configured_and_uses_base_weights():
    domains = [_domain("weak"), _domain("good")]
    statuses = {"weak": _result("weak", 0.1, 0.1), "good": _result("good", 0.9, 0.9)}
    kept, excluded = apply_calibration_gate(domains, statuses, CalibrationPolicy(mode="downweight", factor=0.5),
                                            base_weights={"weak": 2.0})
    assert kept == pytest.approx({"weak": 1.0, "good": 0.5}) and excluded == {}


def test_per_domain_thresholds_rubric_then_domain_params_override_policy():
    lenient_rubric = {**RUBRIC, "calibration": {"min_spearman": 0.2, "min_kappa": 0.1}}
    domains = [_domain("by_rubric", rubric=lenient_rubric),
               _domain("by_params", rubric=lenient_rubric, calibration={"min_spearman": 0.9}),
               _domain("soft", calibration={"mode": "downweight", "factor": 0.1})]
    statuses = {"by_rubric": _result("by_rubric", 0.3, 0.2, rubric=lenient_rubric),
                "by_params": _result("by_params", 0.3, 0.2, rubric=lenient_rubric),
                "soft": _result("soft", 0.3, 0.2)}
    kept, excluded = apply_calibration_gate(domains, statuses)
    assert kept == {"by_rubric": 0.5, "soft": pytest.approx(0.05)}
    assert "spearman=0.300 < 0.9" in excluded["by_params"]


def test_stale_calibrations_do_not_count():
    other_rubric = {**RUBRIC, "description": "edited since"}
    domains = [_domain("edited", rubric=other_rubric), _domain("swapped", judge={"model": "/x", "judge_id": "judge-b"})]
    statuses = {"edited": _result("edited", 0.9, 0.9), "swapped": _result("swapped", 0.9, 0.9)}
    kept, excluded = apply_calibration_gate(domains, statuses, CalibrationPolicy(mode="downweight"))
    assert kept == pytest.approx({"edited": 0.125, "swapped": 0.125})
    _, excluded = apply_calibration_gate(domains, statuses)
    assert "another rubric version" in excluded["edited"] and "another judge (judge-a)" in excluded["swapped"]


def test_unusable_judge_config_is_excluded_even_in_downweight_mode():
    broken = _domain("broken", judge={"model": "/no/such/folder"})  # no judge_id: needs the folder's fingerprint
    kept, excluded = apply_calibration_gate([broken], {}, CalibrationPolicy(mode="downweight"))
    assert kept == {} and "judge configuration unusable" in excluded["broken"]
    assert "not a Hugging Face model folder" in excluded["broken"]


# ---- review form and labels -------------------------------------------------------------------

def _item():
    from temper.judges.review import JudgedItem

    return JudgedItem(domain="summaries", item_id="sum-0-000001", prompt="Summarize: x", response="y", reference=None,
                      judge_score=0.5, judge_raw_score=3.0, rationale="JUDGE-SAYS", digest="a" * 64, judge_id="judge-a",
                      rubric_digest="b" * 64)


def test_review_form_is_bounded_by_the_rubric_and_blind_to_the_judge():
    from pydantic import ValidationError

    from tasks.human_validation import ReviewInput
    from temper.judges.review import ReviewError, check_review, review_markdown

    rubric = Rubric.model_validate({**RUBRIC, "scale": {"min": 0, "max": 3}})
    md = review_markdown(_item(), rubric, "1/4")
    form = ReviewInput.for_item(rubric, md)
    schema = form.model_json_schema()["properties"]["score"]
    assert (schema["minimum"], schema["maximum"]) == (0, 3) and form._description == md
    assert "sum-0-000001" in md and "Summarize: x" in md and "JUDGE-SAYS" not in md and "judge" not in md.lower()
    assert form(score=2).comment is None
    with pytest.raises(ValidationError):
        form(score=4)
    assert check_review(form(score=3, comment="fine"), _item(), rubric) == (3, "fine")
    with pytest.raises(ReviewError, match=r"item summaries/sum-0-000001: reviewer score 9 is outside the rubric scale 0\.\.3"):
        check_review(form.model_construct(score=9), _item(), rubric)
    with pytest.raises(ReviewError, match="is not an integer"):
        check_review(form.model_construct(score="3"), _item(), rubric)


def test_labels_pass_their_contract_and_are_versioned_by_digest(temper_home):
    import hashlib

    from temper.core.errors import ContractViolation
    from temper.judges.labels import label_record, write_labels

    rubric = Rubric.model_validate(RUBRIC)
    rec = label_record(_item(), rubric, 4, "", "flow-1")
    uri, sha, frame = write_labels("summaries", [rec, {**rec, "id": "other", "human_score": 2}])
    data = (temper_home / "store" / "human_labels" / "summaries" / f"{sha}.jsonl").read_bytes()
    assert uri.endswith(f"human_labels/summaries/{sha}.jsonl") and hashlib.sha256(data).hexdigest() == sha
    assert len(frame) == 2
    with pytest.raises(ContractViolation, match=r"violate contract human_labels: .*unique on id"):
        write_labels("summaries", [rec, rec])
    with pytest.raises(ContractViolation, match=r"regex on judge_digest"):
        write_labels("summaries", [{**rec, "judge_digest": "nope"}])
