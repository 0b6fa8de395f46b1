"""The human_validation flow under a real Prefect API: it pauses per judged item, a reviewer resumes it
through the API with run input (from another thread), labels are stored by digest and calibrated in MLflow."""

from __future__ import annotations

import contextvars
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "open_ended"


@pytest.fixture
def open_ended_env(temper_home, mlflow_server, prefect_api, monkeypatch, tmp_path):
    """A catalog of the summaries example (judged by the tiny model) plus one non-judge domain."""
    from temper.core.settings import get_settings
    from temper.training.tiny import init_tiny

    tiny = init_tiny(tmp_path / "tiny")
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    domain = yaml.safe_load((FIXTURE / "domains" / "summaries.yaml").read_text())
    domain["verifier"]["params"]["judge"] = {"model": str(tiny), "scoring": "choice", "max_new_tokens": 8}
    (catalog / "summaries.yaml").write_text(yaml.safe_dump(domain))
    shutil.copy(REPO / "domains" / "arithmetic.yaml", catalog / "arithmetic.yaml")
    monkeypatch.setenv("TEMPER_CATALOG_DIR", str(catalog))
    monkeypatch.setenv("TEMPER_TRACKING_URI", mlflow_server)
    get_settings.cache_clear()

    from temper.data.catalog import load_catalog
    from temper.data.datasets import read_dataset
    from temper.data.generators import generate_domain_dataset

    d = load_catalog(catalog)["summaries"]
    generate_domain_dataset(d)
    return read_dataset(d)


def _example_contract_validates(frame):
    from data_contracts.model import load_contract
    from data_contracts.runner import GXRunner

    report = GXRunner().validate("summaries", load_contract(FIXTURE / "contracts" / "summaries.yaml"), frame,
                                 dataset_uri="x", digest="y")
    assert report.success, report.failures


class Reviewer:
    """Plays the reviewer: for each pause, reads the item from the form, first sends an out-of-range
    score (the API must refuse it), then the item's designed quality as the score."""

    def __init__(self, quality: dict[str, int]) -> None:
        self.quality = quality
        self.resumed: list[tuple[str, int]] = []
        self.rejections: list[str] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from prefect import get_client
        from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState, \
            FlowRunFilterStateType
        from prefect.flow_runs import resume_flow_run
        from prefect.input.actions import read_flow_run_input

        try:
            with get_client(sync_client=True) as client:
                while not self.stop.is_set():
                    runs = client.read_flow_runs(
                        flow_filter=FlowFilter(name=FlowFilterName(any_=["human_validation"])),
                        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=["PAUSED"]))))
                    for run in runs:
                        keyset = run.state.state_details.run_input_keyset
                        description = read_flow_run_input(keyset["description"], flow_run_id=run.id)
                        item = re.search(r"item `([^`]+)`", description).group(1)
                        if any(i == item for i, _ in self.resumed):
                            continue  # already answered; the flow has not left this pause yet
                        if not self.rejections:
                            try:
                                resume_flow_run(run.id, run_input={"score": 9})
                            except RuntimeError as e:
                                self.rejections.append(str(e))
                        score = self.quality[item]
                        resume_flow_run(run.id, run_input={"score": score, "comment": f"reviewed {item}"})
                        self.resumed.append((item, score))
                    time.sleep(0.3)
        except BaseException as e:  # surfaced by the test
            self.errors.append(e)


@pytest.mark.timeout(240)
def test_flow_pauses_per_item_and_resumes_with_reviewer_input(open_ended_env):
    from flows.human_validation import HumanValidationParams, human_validation
    from temper.data.catalog import load_catalog
    from temper.judges.calibration import apply_calibration_gate, calibration_status
    from temper.core.settings import get_settings

    frame = open_ended_env
    _example_contract_validates(frame)
    reviewer = Reviewer(dict(zip(frame["id"], frame["candidate_quality"])))
    thread = threading.Thread(target=contextvars.copy_context().run, args=(reviewer.run,), daemon=True)
    thread.start()
    try:
        params = HumanValidationParams(items_per_domain=3, poll_interval_s=1, review_timeout_s=90)
        state = human_validation(params, return_state=True)
    finally:
        reviewer.stop.set()
        thread.join(10)
    assert not reviewer.errors, reviewer.errors
    assert state.is_completed(), state.message
    result = state.result()

    # The API refused the out-of-range score with a reason naming the field; the flow kept waiting.
    assert len(reviewer.rejections) == 1 and "Cannot resume this run" in reviewer.rejections[0]
    assert "9" in reviewer.rejections[0]
    assert set(result["domains"]) == {"summaries"} and result["skipped_domains"] == {}  # arithmetic: not a judge domain
    s = result["domains"]["summaries"]
    assert (s["judged"], s["labelled"], s["judge_skipped"], s["review_skipped"]) == (3, 3, {}, {})
    assert len(reviewer.resumed) == 3

    # Labels: a versioned jsonl named by its sha256, holding exactly what the reviewer entered.
    import hashlib
    import json

    path = get_settings().home / "store" / "human_labels" / "summaries" / f"{s['labels_sha256']}.jsonl"
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == s["labels_sha256"] and s["labels_uri"].endswith(path.name)
    rows = [json.loads(line) for line in data.decode().splitlines()]
    assert sorted((r["item_id"], r["human_score"]) for r in rows) == sorted(reviewer.resumed)
    assert all(r["comment"] == f"reviewed {r['item_id']}" and r["flow_run_id"] == str(state.state_details.flow_run_id)
               for r in rows)

    # Calibration in MLflow: 3 labels are too few for the default min_n, so the judge stays unverified.
    c = s["calibration"]
    assert c["n"] == 3 and c["status"] == "unverified" and "n=3 < min_n=20" in c["reason"]
    latest = calibration_status(["summaries"])["summaries"]
    assert latest.run_id == c["run_id"] and latest.status == "unverified" and latest.n == 3
    catalog = load_catalog(get_settings().catalog_dir)
    kept, excluded = apply_calibration_gate(list(catalog.values()), {"summaries": latest})
    assert kept == {"arithmetic": catalog["arithmetic"].sampling_ratio}
    assert "n=3 < min_n=20" in excluded["summaries"]

    # Re-judging the same session is free: every judge output comes from the cache.
    from temper.verifiers.registry import get_verifier

    v = get_verifier("judge", catalog["summaries"].verifier.params)
    v.judge.backend.generate = v.judge.backend.choose = None  # would raise if called
    for r in rows:
        rec = frame[frame["id"] == r["item_id"]].iloc[0].to_dict()
        assert v.score(rec, rec["candidate"]).reward == r["judge_score"]
    assert v.judge.stats["cache_hits"] == 3 and v.judge.stats["judged"] == 0
