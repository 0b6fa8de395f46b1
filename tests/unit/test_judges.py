"""Judges without a model: rubric parsing, score parsing, cache keys, agreement stats, the gate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from temper.judges.calibration import (CalibrationPolicy, CalibrationResult, agreement, apply_calibration_gate,
                                       bin_scores, cohen_kappa, spearman)
from temper.judges.cache import JudgeCache, cache_key
from temper.judges.judge import JudgeOutputError, parse_score
from temper.judges.rubric import Rubric, RubricError, load_rubric
from tests.conftest import REPO

RUBRIC = Rubric(name="r", task="t", criteria=["c"], scale_min=1, scale_max=5)


def test_shipped_rubric_parses_and_bad_rubrics_name_the_problem(tmp_path):
    assert load_rubric(REPO / "rubrics" / "summaries.yaml").scale_max == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntask: t\ncriteria: [a]\nscale_min: 5\nscale_max: 1\n")
    with pytest.raises(RubricError, match="bad.yaml.*scale_max"):
        load_rubric(bad)
    bad.write_text("name: [unclosed\n")
    with pytest.raises(RubricError, match="malformed YAML"):
        load_rubric(bad)
    bad.write_text("name: x\ntask: t\ncriteria: []\n")
    with pytest.raises(RubricError, match="criteria"):
        load_rubric(bad)


def test_parse_score_reads_the_scale_and_rejects_outputs_without_one():
    assert parse_score("Score: 4 - concise and correct", RUBRIC) == (4, "concise and correct")
    assert parse_score("score=2/5\nmisses the fact", RUBRIC) == (2, "misses the fact")
    with pytest.raises(JudgeOutputError, match="doc-7: judge output has no 'Score: N'"):
        parse_score("I like it a lot", RUBRIC, item="doc-7")
    with pytest.raises(JudgeOutputError, match="doc-8: judge score 9 outside the scale 1..5"):
        parse_score("Score: 9", RUBRIC, item="doc-8")


def test_cache_key_separates_every_part_and_the_cache_round_trips(tmp_path):
    k = cache_key("r", "p", "resp", "j")
    assert k != cache_key("r", "pr", "esp", "j")  # length-prefixed parts: no concatenation collisions
    assert k != cache_key("r", "p", "resp", "j2")
    cache = JudgeCache(tmp_path / "c.sqlite")
    assert cache.get(k) is None
    cache.put(k, {"score": 3, "rationale": "ok"})
    assert JudgeCache(tmp_path / "c.sqlite").get(k) == {"score": 3, "rationale": "ok"}


def test_agreement_statistics_on_hand_computed_labels():
    # ranks of b with a tie: [1, 2, 3.5, 5, 3.5]; r = 8 / sqrt(10 * 9.5)
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / (10 * 9.5) ** 0.5)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # observed 3/4, chance 0.5*0.25 + 0.5*0.75 = 0.5 -> kappa 0.5
    assert cohen_kappa([0, 0, 1, 1], [0, 1, 1, 1]) == pytest.approx(0.5)
    assert bin_scores([1, 2, 3, 4, 5], 1, 5, 3) == [0, 0, 1, 2, 2]
    res = agreement("d", [1, 2, 3, 4, 5], [5, 6, 7, 8, 7], scale=(1, 8), threshold=0.8)
    assert res.n == 5 and res.verified
    assert not agreement("d", [1, 2, 3], [3, 2, 1], scale=(1, 5), threshold=0.5).verified


def _domain(name, family, ratio=1.0):
    return SimpleNamespace(name=name, sampling_ratio=ratio, verifier=SimpleNamespace(family=family))


def test_calibration_gate_excludes_or_downweights_only_unverified_judge_domains():
    domains = [_domain("math", "numeric"), _domain("good", "judge"), _domain("bad", "judge", 0.5),
               _domain("new", "judge")]
    statuses = {"good": CalibrationResult("good", 20, 0.8, 0.6, 0.5),
                "bad": CalibrationResult("bad", 20, 0.2, 0.1, 0.5)}
    kept, flagged = apply_calibration_gate(domains, statuses, CalibrationPolicy())
    assert kept == {"math": 1.0, "good": 1.0}
    assert set(flagged) == {"bad", "new"} and "Spearman 0.20 < 0.50 (n=20" in flagged["bad"]
    assert "never calibrated" in flagged["new"]
    kept, flagged = apply_calibration_gate(domains, statuses, CalibrationPolicy(mode="downweight", downweight=0.1))
    assert kept["bad"] == pytest.approx(0.05) and flagged["bad"].startswith("down-weighted x0.1")
