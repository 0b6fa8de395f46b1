"""The lifecycle flows under a real Prefect API (test harness) against a real MLflow server.

One end-to-end post_training run (2 ZeRO-3 ranks, eval jobs, registry) is shared by the
evaluate and retrain checks that follow it; the violation case never reaches training.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.integration.conftest import generate

pytestmark = pytest.mark.slow  # trains or runs whole benchmarks: `make test-fast` skips it


MODEL = "temper-flow-test"


@pytest.fixture
def flow_env(tracked, prefect_api):
    generate("arithmetic", "multiplication")
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
    from temper.lifecycle.params import EvalSettings, GRPOSettings, PostTrainingParams, SFTStage

    fields = dict(model_name=MODEL, domains=["arithmetic", "multiplication"], sft=SFTStage(max_steps=60),
                  grpo=GRPOSettings(max_steps=4), eval=EvalSettings(limit=32))
    return PostTrainingParams(**{**fields, **kw})


def test_post_training_end_to_end_then_evaluate_and_retrain(flow_env, mlflow_server):
    from mlflow.tracking import MlflowClient

    from flows.evaluate import evaluate
    from flows.post_training import post_training
    from flows.retrain import retrain
    from temper.lifecycle.params import EvalSettings, EvaluateParams, RetrainParams

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

    # retrain: nothing changed since the latest version (the champion) -> no post_training run.
    assert retrain(RetrainParams(post_training=_small_params())) == {
        "ran": False, "changed": [], "latest_version": str(reg["version"])}


def test_contract_violation_stops_before_any_training(flow_env, mlflow_server):
    from mlflow.tracking import MlflowClient

    from flows.post_training import post_training
    from infra.storage import write_bytes_atomic
    from temper.data.catalog import load_catalog
    from temper.data.datasets import read_dataset, serialize_dataset
    from temper.core.settings import get_settings

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
                              "tags.`temper.data.validation` = 'fail'")
    assert runs and runs[0].info.status == "FAILED"


def test_retrain_on_changed_data_registers_a_gated_version_then_rests(flow_env, mlflow_server):
    """New digest -> retrain runs post_training -> v2 registered, the gate decides against the champion;
    the same data again -> no run, although v2 failed the gate (latest version, not champion)."""
    from mlflow.tracking import MlflowClient

    from flows.post_training import post_training
    from flows.retrain import retrain
    from temper.data.catalog import load_catalog
    from temper.data.datasets import DATASET_LISTENERS, read_dataset, write_dataset
    from temper.registry.gate import PromotionPolicy
    from temper.lifecycle.params import EvalSettings, GRPOSettings, RetrainParams, SFTStage
    from temper.core.settings import get_settings

    name = "temper-retrain"
    tiny = dict(model_name=name, sft=SFTStage(enabled=False), grpo=GRPOSettings(max_steps=2),
                eval=EvalSettings(limit=8))
    first = post_training(_small_params(**tiny))
    assert first["registered"]["alias"] == "champion"
    client = MlflowClient(mlflow_server)
    v1 = str(first["registered"]["version"])

    d = load_catalog(get_settings().catalog_dir)["multiplication"]
    df = read_dataset(d)
    changes = []
    DATASET_LISTENERS.append(changes.append)
    try:
        write_dataset(d, df.drop(index=df[df["split"] == "train"].index[:5]))
    finally:
        DATASET_LISTENERS.remove(changes.append)
    assert [c.domain for c in changes] == ["multiplication"] and changes[0].previous != changes[0].sha256

    strict = _small_params(**tiny, promotion=PromotionPolicy(min_improvement=1.0))  # no candidate can pass
    again = retrain(RetrainParams(post_training=strict))
    assert again["ran"] and again["changed"] == ["multiplication"] and again["latest_version"] == v1, again
    v2 = str(again["registered"]["version"])
    assert v2 != v1 and again["registered"]["alias"] == "candidate"
    mv2 = client.get_model_version(name, v2)
    assert mv2.tags["temper.gate.passed"] == "false"
    assert set(json.loads(mv2.tags["temper.gate.deltas"])) == {"arithmetic", "multiplication"}  # vs the champion
    assert str(client.get_model_version_by_alias(name, "champion").version) == v1

    # Unchanged data after a failed candidate: the latest version (v2, @candidate) was trained on it.
    # Compared with the champion (the old rule), multiplication would count as changed, every night.
    from temper.data.datasets import load_dataset
    from temper.lifecycle.retraining import changed_domains, trained_digests

    now = {n: load_dataset(load_catalog(get_settings().catalog_dir)[n]).digest for n in ("arithmetic", "multiplication")}
    assert changed_domains(trained_digests(client.get_model_version(name, v1)), now) == ["multiplication"]
    assert retrain(RetrainParams(post_training=strict)) == {"ran": False, "changed": [], "latest_version": v2}
    assert {str(v.version) for v in client.search_model_versions(f"name = '{name}'")} == {v1, v2}


def test_deployments_from_prefect_yaml_register_with_schedule_and_form_schema(prefect_api):
    from flows.deployments import read_entries, servable

    deployments = servable(read_entries())
    for d in deployments:
        asyncio.run(d.apply()) if asyncio.iscoroutinefunction(d.apply) else d.apply()
    remote = {d.name: d for d in _prefect(lambda c: c.read_deployments())}
    assert {"post-training", "evaluate", "retrain", "validate-data", "promote", "rollback",
            "human-validation"} <= set(remote)
    assert "post-training-k8s" not in remote  # needs a kubernetes work pool: `prefect deploy`, not serve

    nightly = remote["retrain"]
    assert [s.schedule.cron for s in nightly.schedules] == ["0 3 * * *"]
    assert nightly.global_concurrency_limit.limit == 1  # a burst of events queues: one retrain at a time
    assert nightly.concurrency_options.collision_strategy == "ENQUEUE"
    (automation,) = _prefect(lambda c: c.read_resource_related_automations(f"prefect.deployment.{nightly.id}"))
    assert automation.trigger.expect == {"temper.dataset.changed"} and automation.enabled
    _prefect(lambda c: c.delete_resource_owned_automations(f"prefect.deployment.{nightly.id}"))
    assert "HumanValidationParams" in remote["human-validation"].parameter_openapi_schema["definitions"]
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


def _poll(read, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while not (got := read()) and time.monotonic() < deadline:
        time.sleep(1)
    return got


def test_dataset_change_event_starts_a_retrain_run(temper_home, prefect_api, capsys):
    """`temper data generate` writing new data emits temper.dataset.changed; the retrain deployment's
    trigger (served from prefect.yaml) turns it into a flow run created by the automation."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.events.filters import EventFilter, EventNameFilter

    from flows.deployments import read_entries, servable
    from temper.cli import main

    (deployment,) = servable([e for e in read_entries() if e.name == "retrain"])
    dep_id = asyncio.run(deployment.apply()) if asyncio.iscoroutinefunction(deployment.apply) else deployment.apply()
    owner = f"prefect.deployment.{dep_id}"
    (automation,) = _prefect(lambda c: c.read_resource_related_automations(owner))
    runs_of = lambda c: c.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep_id])))  # noqa: E731
    try:
        assert _prefect(runs_of) == []
        assert main(["data", "generate", "--domain", "arithmetic"]) == 0  # no file before: a new digest
        assert "emitted temper.dataset.changed for arithmetic" in capsys.readouterr().out
        runs = _poll(lambda: _prefect(runs_of))
        assert len(runs) == 1, "no retrain run within 90 s of the event"
        assert runs[0].created_by.type == "AUTOMATION" and runs[0].created_by.id == automation.id

        def stored_events():  # the server persists events in batches, after triggers saw them
            page = _prefect(lambda c: c.read_events(EventFilter(event=EventNameFilter(name=["temper.dataset.changed"])),
                                                    limit=50))  # the server caps a page at 50
            return [e for e in page.events if e.resource.id == "temper.dataset.arithmetic"]

        sent = _poll(stored_events)
        assert sent and sent[0].payload["previous_sha256"] is None and len(sent[0].payload["sha256"]) == 64

        assert main(["data", "generate", "--domain", "arithmetic", "--overwrite"]) == 0  # same bytes: no event
        assert "emitted" not in capsys.readouterr().out
    finally:
        _prefect(lambda c: c.delete_resource_owned_automations(owner))
        _prefect(lambda c: c.delete_deployment(dep_id))
