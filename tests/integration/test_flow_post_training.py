"""The lifecycle flows under a real Prefect API (test harness) against a real MLflow server.

One end-to-end post_training run (2 ZeRO-3 ranks, eval jobs, registry) is shared by the
evaluate and retrain checks that follow it; the violation case never reaches training.
"""

from __future__ import annotations

import asyncio

import pytest

MODEL = "temper-flow-test"


@pytest.fixture
def flow_env(temper_home, mlflow_server, prefect_api, monkeypatch):
    from temper.settings import get_settings

    monkeypatch.setenv("TEMPER_TRACKING_URI", mlflow_server)
    get_settings.cache_clear()
    from temper.cli import main

    assert main(["data", "generate", "--domain", "arithmetic", "--domain", "multiplication"]) == 0
    return prefect_api


def _prefect(coro_fn):
    from prefect.client.orchestration import get_client

    async def go():
        async with get_client() as client:
            return await coro_fn(client)

    return asyncio.run(go())


def _task_run_names(flow_run_id) -> list[str]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs = _prefect(lambda c: c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))))
    return sorted(r.name for r in runs)


def _report_artifact(flow_run_id) -> str:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    arts = _prefect(lambda c: c.read_artifacts(artifact_filter=ArtifactFilter(
        key=ArtifactFilterKey(any_=["post-training-report"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))))
    assert len(arts) == 1
    return arts[0].data


def _small_params(**kw):
    from temper.lifecycle import EvalSettings, GRPOSettings, PostTrainingParams, SFTStage

    fields = dict(model_name=MODEL, domains=["arithmetic", "multiplication"], sft=SFTStage(max_steps=60),
                  grpo=GRPOSettings(max_steps=4), eval=EvalSettings(limit=32))
    return PostTrainingParams(**{**fields, **kw})


def test_post_training_end_to_end_then_evaluate_and_retrain(flow_env, mlflow_server):
    from mlflow.tracking import MlflowClient

    from flows.evaluate import evaluate
    from flows.post_training import post_training
    from flows.retrain import retrain
    from temper.lifecycle import EvalSettings, EvaluateParams, RetrainParams

    state = post_training(_small_params(), return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    flow_run_id = state.state_details.flow_run_id

    names = _task_run_names(flow_run_id)
    for expected in ("validate-arithmetic", "validate-multiplication", "train-sft", "train-grpo",
                     "eval-base", "eval-candidate"):  # one grouped eval task per model
        assert expected in names, names
    assert result["after"]["multiplication"] > result["before"]["multiplication"], result

    client = MlflowClient(mlflow_server)
    reg = result["registered"]
    mv = client.get_model_version_by_alias(MODEL, "champion")  # first version, no champion before: passes
    assert str(mv.version) == str(reg["version"]) and reg["alias"] == "champion"
    assert float(mv.tags["temper.eval.multiplication.mean_reward"]) == pytest.approx(result["after"]["multiplication"])
    lifecycle = client.get_run(result["lifecycle_run_id"])
    assert lifecycle.info.status == "FINISHED"
    digests = {d.dataset.name: d.dataset.digest for d in lifecycle.inputs.dataset_inputs}
    assert set(digests) == {"arithmetic", "multiplication"} and all(len(v) == 32 for v in digests.values())
    children = client.search_runs([lifecycle.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{lifecycle.info.run_id}'")
    stages = sorted(r.data.tags.get("temper.stage", "") for r in children)
    assert stages.count("eval") == 4 and {"sft", "grpo", "register"} <= set(stages), stages
    sft_run = next(r for r in children if r.data.tags.get("temper.stage") == "sft")
    assert "loss" in sft_run.data.metrics

    report = _report_artifact(flow_run_id)
    assert "| multiplication |" in report and f"version **{reg['version']}**" in report
    assert "report.md" in [a.path for a in client.list_artifacts(lifecycle.info.run_id)]

    # evaluate: the champion re-scored on one domain gives the same greedy result.
    ev = evaluate(EvaluateParams(model_name=MODEL, version="champion",
                                 eval=EvalSettings(domains=["multiplication"], limit=32)))
    assert ev["version"] == str(reg["version"])
    assert ev["means"]["multiplication"] == pytest.approx(result["after"]["multiplication"])

    # retrain: nothing changed since the champion -> no post_training run.
    assert retrain(RetrainParams(post_training=_small_params())) == {"ran": False, "changed": []}


def test_contract_violation_stops_before_any_training(flow_env, mlflow_server):
    from mlflow.tracking import MlflowClient

    from flows.post_training import post_training
    from infra.storage import write_bytes_atomic
    from temper.catalog import load_catalog
    from temper.datasets import read_dataset, serialize_dataset
    from temper.settings import get_settings

    d = load_catalog(get_settings().catalog_dir)["multiplication"]
    df = read_dataset(d)
    df.loc[3, "question"] = "three times four"
    write_bytes_atomic(d.dataset_uri(get_settings().resolved_storage_root), serialize_dataset(df, "jsonl"))

    state = post_training(_small_params(model_name="temper-violation"), return_state=True)
    assert state.is_failed()
    assert "multiplication" in state.message and "data contract" in state.message
    names = _task_run_names(state.state_details.flow_run_id)
    assert not [n for n in names if n.startswith(("train-", "eval-", "register"))], names
    report = _report_artifact(state.state_details.flow_run_id)
    assert "Data contract violation: multiplication" in report and "question" in report

    client = MlflowClient(mlflow_server)
    assert not client.search_registered_models("name = 'temper-violation'")
    runs = client.search_runs([client.get_experiment_by_name("post_training").experiment_id],
                              "tags.`temper.validation` = 'fail'")
    assert runs and runs[0].info.status == "FAILED"


def test_deployments_from_prefect_yaml_register_with_schedule_and_form_schema(prefect_api):
    from temper.deployments import read_entries, servable

    deployments = servable(read_entries())
    for d in deployments:
        asyncio.run(d.apply()) if asyncio.iscoroutinefunction(d.apply) else d.apply()
    remote = {d.name: d for d in _prefect(lambda c: c.read_deployments())}
    assert {"post-training", "evaluate", "retrain-nightly", "validate-data", "promote", "rollback"} <= set(remote)
    assert "post-training-k8s" not in remote  # needs a kubernetes work pool: `prefect deploy`, not serve

    nightly = remote["retrain-nightly"]
    assert [s.schedule.cron for s in nightly.schedules] == ["0 3 * * *"]
    assert not remote["post-training"].schedules  # manual
    schema = remote["post-training"].parameter_openapi_schema
    form = schema["definitions"]["PostTrainingParams"]["properties"]
    assert {"base_model", "domains", "mixing_weights", "sft", "grpo", "eval", "promotion", "backend"} <= set(form)
    assert form["backend"]["enum"] == ["local", "kubernetes"]
    assert schema["definitions"]["GRPOSettings"]["properties"]["num_generations"]["minimum"] == 2
    for stage in ("SFTStage", "GRPOSettings"):  # the knobs a user expects are on the form
        assert {"warmup_steps", "lr_scheduler_type", "weight_decay", "save_steps"} <= set(
            schema["definitions"][stage]["properties"])


def test_impossible_grpo_batch_fails_at_parameter_validation_before_any_task(temper_home, prefect_api):
    """Prefect validates PostTrainingParams when the flow run starts: it fails before any task or job."""
    from prefect.exceptions import ParameterTypeError

    from flows.post_training import post_training

    with pytest.raises(ParameterTypeError, match="divisible by grpo.num_generations"):
        post_training(params={"grpo": {"per_device_batch_size": 3, "num_generations": 4}, "world_size": 1})
    assert not (temper_home / "runs").exists() and not (temper_home / "models").exists()
