"""One execution backend per flow run: the parameter's default, the Prefect form, what each backend
makes of the same TrainConfig and eval command, and the sandbox backend the jobs' verifiers get."""

from __future__ import annotations

import sys

import pytest
import yaml

from temper.core.errors import TemperError
from temper.core.settings import JobSettings, RolloutSettings, get_settings
from temper.lifecycle.execution import JobError, KubernetesExecution, LocalExecution, execution_for
from temper.lifecycle.params import PostTrainingParams


@pytest.fixture
def settings_env(monkeypatch, tmp_path):
    def set_env(**values):
        for key, value in values.items():
            monkeypatch.setenv(key, value)
        get_settings.cache_clear()
    monkeypatch.setenv("TEMPER_HOME", str(tmp_path / "home"))
    yield set_env
    get_settings.cache_clear()


def test_backend_defaults_to_the_setting_when_the_run_starts(settings_env):
    params = PostTrainingParams()  # made before the setting changes, as a flow's default argument is
    assert params.backend is None
    settings_env(TEMPER_BACKEND="kubernetes")
    assert params.resolved().backend == "kubernetes"
    assert PostTrainingParams(backend="local").resolved().backend == "local"
    settings_env(TEMPER_BACKEND="local")
    assert params.resolved().backend == "local"


def test_the_prefect_form_shows_a_typed_choice_without_a_baked_default():
    from prefect.utilities.callables import parameter_schema

    from flows.post_training import post_training

    schema = parameter_schema(post_training).model_dump()
    backend = schema["definitions"]["PostTrainingParams"]["properties"]["backend"]
    choices = [c for c in backend["anyOf"] if "enum" in c]
    assert choices and choices[0]["enum"] == ["local", "kubernetes"] and backend.get("default") is None


def test_execution_for_maps_the_parameter_once_and_refuses_unknown_names():
    assert execution_for("local") is execution_for("local") and execution_for("local").name == "local"
    with pytest.raises(TemperError, match="backend 'docker': unknown"):
        execution_for("docker")


def _cfg(tmp_path, world_size=2):
    from temper.training.config import GRPOSettings, TrainConfig

    return TrainConfig(mode="grpo", run_name="pt-abc-grpo", base_model="s3://b/shared/tiny", output_dir=str(tmp_path / "grpo"),
                       world_size=world_size, grpo=GRPOSettings(max_steps=3))


class NoApi:
    """KubernetesExecution's API is only used by run(); building jobs makes no calls."""


def test_kubernetes_training_job_carries_the_same_config_through_the_store(settings_env, tmp_path):
    from infra.k8s.options import KubernetesOptions
    from temper.training.config import load_config

    settings_env(TEMPER_STORAGE_ROOT=f"file://{tmp_path}/store", TEMPER_TRACKING_URI="http://mlflow.temper.svc:5000")
    ex = KubernetesExecution(api=NoApi(), opts=KubernetesOptions(app_dir="/srv/temper"), host="https://k8s")
    cfg = _cfg(tmp_path)
    spec, model = ex.training_job(cfg, parent_run_id="run123")
    config_uri = spec.command[spec.command.index("--config") + 1]
    assert config_uri == f"file://{tmp_path}/store/runs/pt-abc-grpo/train_config.yaml"
    assert model == f"file://{tmp_path}/store/runs/pt-abc-grpo/model" and spec.command[-1] == model
    sent = load_config(config_uri.removeprefix("file://"))
    assert sent.model_dump(exclude={"output_dir"}) == cfg.model_dump(exclude={"output_dir"})  # one TrainConfig
    assert sent.output_dir.startswith("/tmp/temper/")  # the pod's writable emptyDir
    assert spec.nodes == 2 and spec.procs_per_node == 1 and spec.distributed and spec.retries == 1
    assert spec.name == "grpo-pt-abc-grpo"  # the local job's name too (test_local_training_job_...): one job_name
    assert spec.accelerate_config == "/srv/temper/docker/accelerate-zero3-multinode-cpu.yaml"
    assert spec.env["TEMPER_SANDBOX_BACKEND"] == "kubernetes"
    assert JobSettings.model_validate_json(spec.env["TEMPER_JOB"]).parent_run_id == "run123"
    assert spec.env["TEMPER_STORAGE_ROOT"] == f"file://{tmp_path}/store" and "AWS_SECRET_ACCESS_KEY" not in spec.env
    assert KubernetesOptions.model_validate_json(spec.env["TEMPER_K8S_OPTIONS_JSON"]).app_dir == "/srv/temper"


@pytest.mark.parametrize("env, words", [
    ({"TEMPER_TRACKING_URI": "http://mlflow:5000"}, "storage root"),  # store under TEMPER_HOME: a local path
    ({"TEMPER_STORAGE_ROOT": "s3://b/x"}, "tracking URI sqlite"),
])
def test_kubernetes_refuses_what_pods_cannot_reach(settings_env, tmp_path, env, words):
    settings_env(**env)
    with pytest.raises(TemperError, match=words):
        KubernetesExecution(api=NoApi(), host="h").training_job(_cfg(tmp_path), "r")


def test_local_training_job_is_the_unchanged_local_path(settings_env, tmp_path):
    from temper.training.config import load_config

    cfg = _cfg(tmp_path).model_copy(update={"base_model": str(tmp_path)})
    spec, model = LocalExecution().training_job(cfg, "run123")
    assert model == str(tmp_path / "grpo" / "model") and spec.name == "grpo-pt-abc-grpo"
    assert load_config(spec.command[spec.command.index("--config") + 1]) == cfg
    assert spec.env["TEMPER_SANDBOX_BACKEND"] == "bwrap" and spec.nodes == 1 and spec.procs_per_node == 2


def test_local_shards_each_get_their_index_and_a_failure_names_the_job_with_its_tail():
    from infra.jobspec import JobSpec

    code = ("from temper.core.settings import get_settings as g; s = g(); "
            "print('shard', s.job.shard_index, s.job.num_shards, s.sandbox_backend)")
    lines: list[str] = []
    LocalExecution().run(JobSpec(name="eval-x", kind="eval", command=[sys.executable, "-c", code]), lines.append, shards=3)
    assert sorted(lines) == ["shard 0 3 bwrap", "shard 1 3 bwrap", "shard 2 3 bwrap"]
    bad = "import sys; from temper.core.settings import get_settings as g; print('boom'); sys.exit(g().job.shard_index * 3)"
    with pytest.raises(JobError, match=r"job eval-x-s1 failed with exit status 3; last lines:\nboom"):
        LocalExecution().run(JobSpec(name="eval-x", kind="eval", command=[sys.executable, "-c", bad]), lambda s: None,
                             shards=2)


def test_the_sandbox_backend_follows_the_setting(settings_env, tmp_path, monkeypatch):
    from infra.sandbox import pool
    from infra.sandbox.kubernetes import KubernetesBackend

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings_env(TEMPER_SANDBOX_BACKEND="kubernetes", TEMPER_K8S_OPTIONS_JSON='{"sandbox_namespace": "boxes"}')
    backend = pool._make_backend()
    assert isinstance(backend, KubernetesBackend) and backend.opts.sandbox_namespace == "boxes"
    settings_env(TEMPER_SANDBOX_BACKEND="bwrap")
    assert type(pool._make_backend()).__name__ == "BwrapBackend"


def test_what_the_kubernetes_backend_submits_is_schema_valid_and_restricted(settings_env, tmp_path):
    """The flow's own training and eval jobs, as objects: strict 1.33 schema and Pod Security "restricted"."""
    import kubernetes_validate

    from infra.jobspec import JobSpec
    from infra.k8s import manifests as m
    from tests.unit.test_k8s_static import restricted_violations

    settings_env(TEMPER_STORAGE_ROOT=f"file://{tmp_path}/store", TEMPER_TRACKING_URI="http://mlflow.temper.svc:5000")
    ex = KubernetesExecution(api=NoApi(), host="h")
    train, _ = ex.training_job(_cfg(tmp_path), "run123")
    ev = ex.for_cluster(JobSpec(name="eval-base-0123456789", kind="eval", command=[sys.executable, "-m", "workloads.evaluate"]))
    assert ev.command[0] == "python" and ev.resources == ex.opts.eval_resources
    objects = m.objects_for(train, ex.opts) + m.objects_for(ev, ex.opts, shards=2)
    assert [o.kind for o in objects] == ["Service", "Job", "Job", "Job"]
    for obj in objects:
        doc = m.to_dict(obj)
        kubernetes_validate.validate(doc, "1.33", strict=True)
        if obj.kind == "Job":
            pod = doc["spec"]["template"]["spec"]
            assert restricted_violations(pod) == [] and pod["serviceAccountName"] == "temper-workload"
    shard_env = [{e["name"]: e.get("value") for e in m.to_dict(j)["spec"]["template"]["spec"]["containers"][0]["env"]}
                 for j in objects[2:]]
    shards = [JobSettings.model_validate_json(e["TEMPER_JOB"]) for e in shard_env]
    assert [(j.shard_index, j.num_shards, j.sandbox_owner) for j in shards] == [
        (0, 2, "eval-base-0123456789-s0"), (1, 2, "eval-base-0123456789-s1")]


def test_jobs_get_the_flows_rollout_section_typed_and_pods_only_what_addresses_a_server(settings_env, tmp_path):
    """The rollout section reaches every job as one variable its own Settings parses back; pods do not get this
    machine's model folders, and no job's spec carries the api key."""
    settings_env(TEMPER_ROLLOUT_BACKEND="vllm", TEMPER_ROLLOUT_BASE_URL="http://vllm:8000/v1",
                 TEMPER_ROLLOUT_API_KEY="sk-rollout-key", TEMPER_ROLLOUT_MODEL_DIR=str(tmp_path),
                 TEMPER_STORAGE_ROOT=f"file://{tmp_path}/store", TEMPER_TRACKING_URI="http://mlflow:5000")
    local, _ = LocalExecution().training_job(_cfg(tmp_path).model_copy(update={"base_model": str(tmp_path)}), "r")
    pod, _ = KubernetesExecution(api=NoApi(), host="h").training_job(_cfg(tmp_path), "r")
    sent = {name: RolloutSettings.model_validate_json(spec.env["TEMPER_ROLLOUT"]) for name, spec in
            (("local", local), ("pod", pod))}
    assert (sent["local"].backend, sent["local"].base_url, sent["local"].model_dir) == ("vllm", "http://vllm:8000/v1",
                                                                                       tmp_path)
    assert (sent["pod"].backend, sent["pod"].base_url, sent["pod"].model_dir) == ("vllm", "http://vllm:8000/v1", None)
    assert all("sk-rollout-key" not in value for spec in (local, pod) for value in spec.env.values())


def test_settings_sections_load_from_their_variables_and_from_one_json_variable(settings_env):
    """Users keep TEMPER_ROLLOUT_<FIELD>; a job's section comes as JSON (TEMPER_JOB), and its own variables win."""
    settings_env(TEMPER_ROLLOUT_BACKEND="vllm", TEMPER_ROLLOUT_BASE_URL="http://h:8000/v1",
                 TEMPER_JOB='{"shard_index": 1, "num_shards": 3}', TEMPER_JOB_NUM_SHARDS="4",
                 TEMPER_S3_ENDPOINT_URL="http://minio:9000")
    s = get_settings()
    assert (s.rollout.backend, s.rollout.base_url, s.rollout.model) == ("vllm", "http://h:8000/v1", "temper")
    assert (s.job.shard_index, s.job.num_shards, s.job.parent_run_id) == (1, 4, None)
    assert s.s3_endpoint_url == "http://minio:9000"  # a flat field with "_" in its name is untouched
