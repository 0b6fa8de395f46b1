"""The calibration gate's down-weight mode reaches GRPO's domain mix (it used to be dropped by the flow).

Real pieces: the catalog from YAML files, the gate task's function against the embedded MLflow
store (no calibration run logged: the judge is unverified), the flow's stage config, and the
trainer's own domain sampler built from it.
"""

from __future__ import annotations

import pytest

import collections
import shutil
from pathlib import Path

import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # trains or runs whole benchmarks: `make test-fast` skips it


RUBRIC = {"name": "t", "criteria": [{"name": "c", "description": "good"}], "scale": {"min": 1, "max": 5}}


def _catalog(tmp_path: Path, mode: str) -> Path:
    catalog = tmp_path / f"catalog-{mode}"
    catalog.mkdir()
    shutil.copy(REPO / "domains" / "arithmetic.yaml", catalog)  # numeric, sampling_ratio 0.4
    judged = {"name": "summaries", "description": "judged", "contract": "summaries", "sampling_ratio": 0.2,
              "dataset": {"uri": "{store}/datasets/summaries.jsonl", "format": "jsonl"}, "prompt_template": "{document}",
              "verifier": {"family": "judge", "params": {"rubric": RUBRIC, "judge": {"model": "/nowhere", "judge_id": "j"},
                                                         "calibration": {"mode": mode, "factor": 0.25}}}}
    (catalog / "summaries.yaml").write_text(yaml.safe_dump(judged))
    return catalog


def _refs(catalog_dir):
    from tasks.data import DomainRef
    from temper.data.catalog import load_catalog

    catalog = load_catalog(catalog_dir)
    return [DomainRef(name, f"d{i}", "c", catalog[name], None) for i, name in enumerate(("arithmetic", "summaries"))]


def test_downweighted_judge_domain_is_sampled_at_its_reduced_weight_by_grpo(temper_home, tmp_path):
    from tasks.data import calibration_gate
    from tasks.training import stage_config
    from temper.data.catalog import load_catalog
    from temper.lifecycle.params import PostTrainingParams
    from temper.training.run import new_sampler

    catalog_dir = _catalog(tmp_path, "downweight")
    refs = _refs(catalog_dir)
    params = PostTrainingParams(domains=["arithmetic", "summaries"])
    kept, weights, flagged = calibration_gate.fn(refs, params.mixing_weights, catalog_dir=str(catalog_dir))
    assert [r.name for r in kept] == ["arithmetic", "summaries"]
    assert weights == pytest.approx({"summaries": 0.05})  # 0.2 x 0.25; arithmetic keeps its catalog ratio implicitly
    assert flagged["summaries"].startswith("down-weighted: sampling weight 0.2 -> 0.05")

    grpo = stage_config("grpo", params, "/sft", "pt-x", tmp_path, mixing_weights=weights)
    sft = stage_config("sft", params, "/base", "pt-x", tmp_path)
    assert grpo.mixing_weights == pytest.approx({"summaries": 0.05}) and sft.mixing_weights == {}  # the gate is about RL rewards
    catalog = load_catalog(catalog_dir)
    domains = [catalog["arithmetic"], catalog["summaries"]]
    sampler = new_sampler(grpo, domains, {"arithmetic": [0] * 500, "summaries": [0] * 500})
    assert sampler.ratios == pytest.approx({"arithmetic": 0.4, "summaries": 0.05})
    share = collections.Counter(name for name, _ in sampler.take(9000))["summaries"] / 9000
    assert abs(share - 0.05 / 0.45) < 0.02  # ~11%, not the 33% of the catalog ratios


def test_requested_weights_are_the_base_of_the_downweight_and_excluded_domains_leave_the_mix(temper_home, tmp_path):
    from tasks.data import calibration_gate

    downweight = _catalog(tmp_path, "downweight")
    refs = _refs(downweight)
    requested = {"arithmetic": 2.0, "summaries": 1.0}
    _, weights, _ = calibration_gate.fn(refs, requested, catalog_dir=str(downweight))
    assert weights == pytest.approx({"arithmetic": 2.0, "summaries": 0.25})
    kept, weights, flagged = calibration_gate.fn(refs, requested, catalog_dir=str(_catalog(tmp_path, "exclude")))
    assert [r.name for r in kept] == ["arithmetic"] and weights == {"arithmetic": 2.0}  # no weight for a dropped domain
    assert flagged["summaries"] == "judge never calibrated against human labels"
