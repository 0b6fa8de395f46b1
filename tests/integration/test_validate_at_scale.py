"""Validation at hundreds of domains: the CLI's worker processes and the flow's mapped tasks.

300 domains (copies of the arithmetic domain with their own names, seeds and datasets of 1,000
rows) in a temporary catalog; one dataset is broken on purpose, so the tests also show that a
failure at scale is reported for exactly that domain, with the check that caught it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
N = 300
BROKEN = "scale_137"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def big_catalog(tmp_path_factory):
    """(catalog dir, TEMPER_HOME) with N generated datasets, one of them corrupted."""
    import os

    from infra.storage import write_bytes_atomic
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.datasets import read_dataset, serialize_dataset
    from temper.data.generators import generate_domain_dataset

    root = tmp_path_factory.mktemp("scale")
    catalog, home = root / "catalog", root / "home"
    catalog.mkdir()
    base = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())
    for i in range(N):
        name = f"scale_{i:03d}"
        doc = {**base, "name": name,
               "dataset": {**base["dataset"], "uri": f"{{store}}/scale/{name}.jsonl", "rows": 1000, "seed": i}}
        (catalog / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    old = {k: os.environ.get(k) for k in ("TEMPER_HOME", "TEMPER_CATALOG_DIR")}
    os.environ.update(TEMPER_HOME=str(home), TEMPER_CATALOG_DIR=str(catalog))
    get_settings.cache_clear()
    domains = load_catalog(catalog)
    for d in domains.values():
        generate_domain_dataset(d)
    bad = domains[BROKEN]
    frame = read_dataset(bad)
    frame.loc[3, "answer"] = "forty-two"  # breaks the parses_as_number rule on one row
    write_bytes_atomic(bad.dataset_uri(get_settings().resolved_storage_root), serialize_dataset(frame, "jsonl"))
    yield catalog, home
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    get_settings.cache_clear()


def test_cli_validates_300_domains_in_worker_processes(big_catalog, capsys):
    from temper.cli import main
    from temper.core.settings import get_settings

    catalog, _ = big_catalog
    assert main(["data", "validate", "--catalog", str(catalog), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    names = [d["domain"] for d in report["domains"]]
    assert names == sorted(names) and len(names) == N  # order kept across the worker chunks
    failed = [d for d in report["domains"] if not d["success"]]
    assert [d["domain"] for d in failed] == [BROKEN]
    assert [(f["check"], f["column"], f["unexpected_count"]) for f in failed[0]["failures"]] == \
        [("rule:parses_as_number", "answer", 1)]
    docs = Path(get_settings().resolved_storage_root) / "validation" / "data_docs"
    index = (docs / "index.html").read_text()
    parts = sorted(p.name for p in docs.iterdir() if p.name.startswith("part-"))
    assert parts == ["part-0", "part-1"], "2 CPUs: one Data Docs site per validation worker"
    for part in parts:
        assert f'href="{part}/index.html"' in index
        assert (docs / part / "index.html").exists()


def test_validate_flow_maps_300_domains_and_reports_the_broken_one(big_catalog, prefect_api, mlflow_server,
                                                                    monkeypatch):
    from flows.validate_data import validate_data
    from temper.core.settings import get_settings
    from temper.lifecycle.params import ValidateParams

    monkeypatch.setenv("TEMPER_TRACKING_URI", mlflow_server)
    get_settings.cache_clear()
    state = validate_data(ValidateParams(), return_state=True)
    result = state.result(raise_on_failure=False)
    assert result["failed"] == [BROKEN] and result["success"] is False
    runs = [r for r in _all_task_runs(state.state_details.flow_run_id) if r.name.startswith("validate-")]
    assert len(runs) == N and all(r.state.is_completed() for r in runs)
    # every dataset on the validation's MLflow run (logged in batches of DATASETS_PER_REQUEST), with its
    # digest and context, and one contract_failures metric per domain
    from mlflow.tracking import MlflowClient

    from infra.tracking.runs import DATASETS_PER_REQUEST
    from temper.core.tag_names import TAG_SHA256

    assert N > 2 * DATASETS_PER_REQUEST
    run = MlflowClient(mlflow_server).get_run(result["mlflow_run_id"])
    inputs = {i.dataset.name: i for i in run.inputs.dataset_inputs}
    assert sorted(inputs) == [f"scale_{i:03d}" for i in range(N)]
    for name, i in inputs.items():
        tags = {t.key: t.value for t in i.tags}
        assert tags["mlflow.data.context"] == "validation" and i.dataset.digest == tags[TAG_SHA256][:32], (name, tags)
    failures = {k: v for k, v in run.data.metrics.items() if k.startswith("contract_failures.")}
    assert len(failures) == N and {k for k, v in failures.items() if v} == {f"contract_failures.{BROKEN}"}


def _all_task_runs(flow_run_id):
    """Every task run of the flow run, page by page (the API returns at most 200 at a time)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def go():
        runs = []
        async with get_client() as client:
            while True:
                page = await client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), offset=len(runs), limit=200)
                runs += page
                if len(page) < 200:
                    return runs

    return asyncio.run(go())
