"""The validate_data flow under a real Prefect API: mapped per-domain tasks, digest caching, artifact."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.conftest import generate


@pytest.fixture
def flow_env(tracked, prefect_api):
    generate("arithmetic", "tool_calls")
    return prefect_api


def _task_runs(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def go():
        async with get_client() as client:
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))

    return asyncio.run(go())


def test_validate_flow_maps_per_domain_and_caches_by_digest(flow_env):
    from flows.validate_data import validate_data
    from temper.lifecycle.params import ValidateParams

    params = ValidateParams(domains=["arithmetic", "tool_calls"])
    state = validate_data(params, return_state=True)
    assert state.is_completed() and state.result()["success"]
    runs = _task_runs(state.state_details.flow_run_id)
    assert sorted(r.name for r in runs if r.name.startswith("validate-")) == ["validate-arithmetic", "validate-tool_calls"]

    state2 = validate_data(params, return_state=True)
    runs2 = _task_runs(state2.state_details.flow_run_id)
    cached = [r for r in runs2 if r.name.startswith("validate-")]
    assert cached and all(r.state.name == "Cached" for r in cached), [r.state.name for r in cached]


def test_validate_flow_reports_violation(flow_env):
    from infra.storage import write_bytes_atomic
    from flows.validate_data import validate_data
    from temper.data.catalog import load_catalog
    from temper.data.datasets import read_dataset, serialize_dataset
    from temper.lifecycle.params import ValidateParams
    from temper.core.settings import get_settings

    d = load_catalog(get_settings().catalog_dir)["tool_calls"]
    df = read_dataset(d)
    df.loc[0, "functions"] = "not json"
    write_bytes_atomic(d.dataset_uri(get_settings().resolved_storage_root), serialize_dataset(df, "jsonl"))
    result = validate_data(ValidateParams(domains=["tool_calls"]))
    assert result == {"success": False, "failed": ["tool_calls"], "mlflow_run_id": result["mlflow_run_id"]}
