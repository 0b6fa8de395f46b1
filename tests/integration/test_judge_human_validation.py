"""Judge scoring with a tiny local model, and the human-validation flow paused and resumed
through a real Prefect API (test harness), with labels and calibration in a real MLflow server."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import yaml

from tests.conftest import REPO

RECORDS = [{"id": f"doc-{i}", "document": f"Site {i} opens in {m}.", "response": f"Site {i} opens in {m}.",
            "split": "eval"} for i, m in enumerate(["May", "June", "July", "March", "April", "August"])]


@pytest.fixture
def judged_catalog(temper_home, tmp_path, monkeypatch):
    """A catalog with one judge-scored domain; the judge is a tiny random local model."""
    from temper.settings import get_settings
    from temper.training.tiny import init_tiny

    judge = init_tiny(tmp_path / "judge")
    data = tmp_path / "summaries.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "summaries.yaml").write_text(yaml.safe_dump({
        "name": "summaries", "description": "one-sentence summaries, judged",
        "dataset": {"uri": str(data), "format": "jsonl"}, "prompt_template": "Document: {document}\nSummary:",
        "verifier": {"family": "judge", "params": {"rubric": str(REPO / "rubrics" / "summaries.yaml"),
                                                   "model": str(judge), "prompt_field": "document"}},
        "contract": "summaries"}))
    monkeypatch.setenv("TEMPER_CATALOG_DIR", str(catalog))
    get_settings.cache_clear()
    return catalog


def test_judge_scores_deterministically_and_caches(judged_catalog):
    from temper.catalog import load_catalog
    from temper.verifiers.registry import get_verifier

    d = load_catalog(judged_catalog)["summaries"]
    v = get_verifier(d.verifier.family, d.verifier.params)
    first = v.score(RECORDS[0], RECORDS[0]["response"])
    again = v.score(RECORDS[0], RECORDS[0]["response"])
    assert first is not None and 0.0 <= first.reward <= 1.0 and first.details["score"] in range(1, 6)
    assert not first.details["cached"] and again.details["cached"]
    assert (again.reward, again.details["score"]) == (first.reward, first.details["score"])
    from temper.judges.judge import get_judge

    cache = get_judge(model=d.verifier.params["model"]).cache
    hits = cache.hits
    v2 = get_verifier(d.verifier.family, d.verifier.params)  # a new verifier, same judge and cache file
    assert v2.score(RECORDS[0], RECORDS[0]["response"]).details["cached"] and cache.hits == hits + 1
    assert not v2.score(RECORDS[0], "something else").details["cached"]


def _paused_run(timeout: float = 120):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState,
                                                FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    async def read():
        async with get_client() as c:
            return await c.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["human_validation"])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))))

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = asyncio.run(read())
        if runs:
            return runs[0]
        time.sleep(0.5)
    raise AssertionError("the flow never paused for review")


def test_human_validation_pauses_per_item_and_resumes_with_run_input(judged_catalog, mlflow_server, prefect_api,
                                                                       monkeypatch):
    from prefect.flow_runs import resume_flow_run

    from flows.human_validation import HumanValidationParams, human_validation
    from temper.judges.calibration import calibration_status
    from temper.settings import get_settings

    monkeypatch.setenv("TEMPER_TRACKING_URI", mlflow_server)
    get_settings.cache_clear()
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(state=human_validation(
        HumanValidationParams(samples_per_domain=3, review_timeout_s=120), return_state=True)))
    worker.start()
    answers = [{"score": 5, "reviewer": "ann"}, {"score": 9, "reviewer": "ann"}, {"score": 2, "reviewer": "ann"}]
    for answer in answers:
        run = _paused_run()
        result = resume_flow_run(run.id, run_input=answer)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
        while _state_of(run.id) == "PAUSED":  # wait until the flow consumed this answer
            time.sleep(0.3)
    worker.join(180)
    state = out["state"]
    assert state.is_completed(), state.message
    summary = state.result()["summaries"]
    assert summary["labels"] == 2
    assert len(summary["skipped"]) == 1 and "reviewer score 9 outside the scale 1..5" in summary["skipped"][0]
    assert summary["skipped"][0].startswith("summaries/doc-")

    from infra.storage import get_fs

    fs, path = get_fs(summary["labels_uri"])
    rows = [json.loads(line) for line in fs.cat_file(path).decode().splitlines()]
    assert sorted(r["human_score"] for r in rows) == [2, 5]
    assert summary["labels_sha256"][:16] in summary["labels_uri"]

    from infra import lineage

    lineage.configure()
    status = calibration_status(["summaries"])["summaries"]
    assert status.n == 2 and status.run_id == summary["mlflow_run_id"]
    assert status.verified == summary["verified"]


def _state_of(flow_run_id) -> str:
    from prefect.client.orchestration import get_client

    async def read():
        async with get_client() as c:
            return (await c.read_flow_run(flow_run_id)).state.type.value

    return asyncio.run(read())
