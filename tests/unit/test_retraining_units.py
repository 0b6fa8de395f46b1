"""Pure parts of retraining: which domains changed, who hears of a dataset write, which deployments carry triggers."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_changed_domains_against_the_trained_digests():
    from temper.lifecycle.retraining import changed_domains

    a, b = "a" * 64, "b" * 64
    assert changed_domains(None, {"x": a, "y": b}) == ["x", "y"]  # no version yet: everything
    assert changed_domains({"x": a[:32], "y": b[:32]}, {"x": a, "y": b}) == []
    assert changed_domains({"x": a[:32], "y": a[:32]}, {"x": a, "y": b}) == ["y"]
    assert changed_domains({"x": a[:32]}, {"x": a, "z": b}) == ["z"]  # a new domain
    assert changed_domains({"x": a[:32]}, {"x": None}) == ["x"]  # unreadable now: retrain decides loudly


def test_write_dataset_announces_only_a_changed_digest(temper_home):
    from temper.data.catalog import load_catalog
    from temper.data.datasets import DATASET_LISTENERS, read_dataset, write_dataset
    from temper.data.generators import generate_domain_dataset
    from temper.core.settings import get_settings

    d = load_catalog(get_settings().catalog_dir)["arithmetic"]
    heard = []
    DATASET_LISTENERS.append(heard.append)
    try:
        uri, first, written = generate_domain_dataset(d)
        assert written and [(c.domain, c.previous, c.sha256) for c in heard] == [("arithmetic", None, first)]
        generate_domain_dataset(d, overwrite=True)  # deterministic: the same bytes, nothing to announce
        assert len(heard) == 1
        frame = read_dataset(d)
        _, second = write_dataset(d, frame.head(len(frame) - 1))
        assert second != first and (heard[-1].previous, heard[-1].sha256, heard[-1].uri) == (first, second, uri)
    finally:
        DATASET_LISTENERS.remove(heard.append)


def test_retrain_deployment_carries_its_event_trigger_and_a_bad_trigger_names_the_file(tmp_path):
    from flows.deployments import read_entries
    from temper.core.errors import TemperError

    retrain = next(e for e in read_entries() if e.name == "retrain")
    (trigger,) = retrain.triggers
    assert trigger.expect == {"temper.dataset.changed"}
    assert trigger.match.root["prefect.resource.id"] == "temper.dataset.*" and retrain.crons == ["0 3 * * *"]
    assert retrain.concurrency_limit == {"limit": 1, "collision_strategy": "ENQUEUE"}
    assert "human-validation" in {e.name for e in read_entries()}

    bad = tmp_path / "prefect.yaml"
    bad.write_text("deployments:\n  - name: r\n    entrypoint: flows/retrain.py:retrain\n"
                   "    triggers:\n      - type: event\n        posture: Sideways\n")
    with pytest.raises(TemperError, match=r"prefect.yaml: deployment 'r' triggers: field '.*posture'"):
        read_entries(bad)
