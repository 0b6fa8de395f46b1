"""A registered version is an MLflow `transformers` model, in the one embedded store `temper up` serves.

The registry is written by the register task of post_training (its plain function: the demo's
registration path) into the embedded sqlite store, with a real eval run for its dataset link.
Then: `mlflow.transformers.load_model("models:/NAME@champion")`, the logged model with its
metrics and dataset, eval's loader on the new layout and on a version registered the old way
(HF folder as plain `model/` artifacts), `mlflow models serve --env-manager local`, and the
MLflow server `temper up` starts, reading the same store over REST.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from temper.core.tag_names import TAG_FORMAT, TAG_STAGE
from tests.integration.conftest import _wait_http, free_port, stop_process

MODEL = "temper-demo"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """Embedded home with one version registered by the register task (champion) and one the old way."""
    home = tmp_path_factory.mktemp("store") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEMPER_HOME", str(home))
        mp.setenv("TEMPER_CATALOG_DIR", str(Path(__file__).resolve().parents[2] / "domains"))
        for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "TEMPER_S3_ENDPOINT_URL"):
            mp.delenv(var, raising=False)
        from temper.core.settings import get_settings

        get_settings.cache_clear()
        yield _register(home)
        get_settings.cache_clear()


def _register(home: Path) -> dict:
    import mlflow

    from infra.tracking.connection import configure
    from infra.tracking.runs import open_run
    from tasks.registry import register
    from temper.cli import main
    from temper.core.settings import get_settings
    from temper.core.tag_names import TAG_KIND
    from temper.data.catalog import load_catalog
    from temper.data.datasets import load_dataset
    from temper.lifecycle.evaluation import record_eval
    from temper.lifecycle.params import EvalSettings, PostTrainingParams
    from temper.registry.gate import GateDecision
    from temper.training.tiny import init_tiny

    assert main(["data", "generate", "--domain", "arithmetic"]) == 0
    model_dir = init_tiny(home / "tiny")
    configure()
    parent = open_run("post_training", "pt-test", tags={TAG_KIND: "lifecycle"})
    ds = load_dataset(load_catalog(get_settings().catalog_dir)["arithmetic"])
    eval_run = record_eval({"domain": "arithmetic", "model": str(model_dir), "dataset_uri": ds.uri,
                            "dataset_sha256": ds.digest, "n": 2, "scored": 2, "mean_reward": 0.5, "pass_rate": 0.5,
                            "wall_s": 0.1, "ids": ["a", "b"], "rewards": [1.0, 0.0]}, "candidate", parent)
    params = PostTrainingParams(model_name=MODEL, domains=["arithmetic"], eval=EvalSettings(max_new_tokens=6))
    reg = register.fn(params, str(model_dir), parent,
                      {"arithmetic": {"domain": "arithmetic", "mean_reward": 0.5, "pass_rate": 0.5, "n": 2,
                                      "scored": 2, "run_id": eval_run}},
                      GateDecision(passed=True, reason="no champion yet"))
    # A version registered before logged models: the HF folder as plain artifacts under model/.
    with mlflow.start_run(experiment_id=mlflow.get_experiment_by_name("post_training").experiment_id) as run:
        mlflow.log_artifacts(str(model_dir), "model")
    legacy = mlflow.MlflowClient().create_model_version(MODEL, f"{run.info.artifact_uri}/model", run.info.run_id)
    return {"home": home, "model_dir": model_dir, "registered": reg, "legacy_version": str(legacy.version),
            "dataset_sha256": ds.digest, "tracking_uri": get_settings().resolved_tracking_uri}


def _greedy(model_dir, prompt: str, tokens: int) -> str:
    from workloads.evaluate import generate_completions

    return generate_completions(str(model_dir), [prompt], tokens)[0]


def test_version_loads_as_a_transformers_pipeline_with_metrics_and_dataset(registry):
    import mlflow
    from mlflow.models import Model

    reg = registry["registered"]
    assert reg["alias"] == "champion" and reg["source"].startswith("models:/m-")
    pipe = mlflow.transformers.load_model(f"models:/{MODEL}@champion")
    assert type(pipe).__name__ == "TextGenerationPipeline"
    prompt = "3 + 4 = "
    out = pipe(prompt, max_new_tokens=5, do_sample=False, return_full_text=False)[0]["generated_text"]
    assert out == _greedy(registry["model_dir"], prompt, 5)  # same weights, same tokenizer

    client = mlflow.MlflowClient()
    mv = client.get_model_version_by_alias(MODEL, "champion")
    logged = client.get_logged_model(reg["source"].removeprefix("models:/"))
    assert logged.source_run_id == mv.run_id and client.get_run(mv.run_id).data.tags[TAG_STAGE] == "register"
    metrics = {m.key: m for m in logged.metrics}
    assert metrics["eval.arithmetic.mean_reward"].value == pytest.approx(0.5)
    assert metrics["eval.arithmetic.mean_reward"].dataset_name == "arithmetic"
    assert metrics["eval.arithmetic.mean_reward"].dataset_digest == registry["dataset_sha256"][:32]
    assert logged.params["base_model"] == "tiny"
    found = client.search_logged_models(experiment_ids=[logged.experiment_id])
    assert logged.model_id in {m.model_id for m in found}

    local = Path(mlflow.artifacts.download_artifacts(reg["source"]))
    spec = Model.load(str(local))
    assert "transformers" in spec.flavors and "python_function" in spec.flavors
    assert {p.name for p in spec.signature.params} >= {"max_new_tokens", "do_sample"}
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.datasets import read_dataset

    domain = load_catalog(get_settings().catalog_dir)["arithmetic"]
    frame = read_dataset(domain)
    first_eval = frame[frame[domain.split.column] == domain.split.eval].iloc[0].to_dict()
    example = spec.load_input_example(str(local))
    assert list(example) == [domain.render_prompt(first_eval)]  # the first arithmetic eval prompt


@pytest.mark.parametrize("layout", ["logged-model", "plain-artifacts"])
def test_eval_loader_reads_both_layouts(registry, layout):
    from tasks.evaluation import fetch_model

    version = registry["registered"]["version"] if layout == "logged-model" else registry["legacy_version"]
    got = fetch_model.fn(MODEL, str(version))
    folder = Path(got["model_dir"])
    assert (folder / "config.json").exists() and (folder / "tokenizer.json").exists()
    assert not (folder.parent / f"{folder.name}.partial").exists()
    assert _greedy(folder, "2 * 5 = ", 6) == _greedy(registry["model_dir"], "2 * 5 = ", 6)
    assert fetch_model.fn(MODEL, str(version))["model_dir"] == str(folder)  # cached: no second download


def test_mlflow_models_serve_answers_an_invocation(registry, tmp_path):
    from transformers import AutoTokenizer

    from temper.core.chat import chat_prompt

    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "MLFLOW_TRACKING_URI": registry["tracking_uri"],
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # serve execs `uvicorn` from PATH
    proc = subprocess.Popen([str(BIN / "mlflow"), "models", "serve", "--env-manager", "local",
                             "-m", f"models:/{MODEL}@champion", "-h", "127.0.0.1", "-p", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/ping", proc, 180, log)
        r = requests.post(f"http://127.0.0.1:{port}/invocations", timeout=60,
                          json={"inputs": ["3 + 4 = "], "params": {"max_new_tokens": 5}})
        assert r.status_code == 200, r.text
        predictions = r.json()["predictions"]
        # the served pyfunc applies the model's chat template (prompt_template), as eval formats prompts
        templated = chat_prompt(AutoTokenizer.from_pretrained(registry["model_dir"]), "3 + 4 = ")
        assert predictions == [_greedy(registry["model_dir"], templated, 5)], (predictions, log.read_text()[-2000:])
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(20)


def test_temper_up_mlflow_server_serves_the_store_the_demo_wrote(registry, tmp_path):
    from temper.commands.up import mlflow_server_argv
    from temper.core.settings import Settings

    settings = Settings(home=registry["home"])
    assert settings.resolved_tracking_uri == registry["tracking_uri"]
    port = free_port()
    log = tmp_path / "mlflow.log"
    proc = subprocess.Popen(mlflow_server_argv(settings, "127.0.0.1", port), stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url + "/health", proc, 120, log)
        rm = requests.get(f"{url}/api/2.0/mlflow/registered-models/get", params={"name": MODEL}, timeout=10).json()
        assert {a["alias"] for a in rm["registered_model"]["aliases"]} == {"champion"}
        mv = requests.get(f"{url}/api/2.0/mlflow/registered-models/alias", params={"name": MODEL, "alias": "champion"},
                          timeout=10).json()["model_version"]
        assert mv["source"] == registry["registered"]["source"]
        model_id = mv["source"].removeprefix("models:/")
        lm = requests.get(f"{url}/api/2.0/mlflow/logged-models/{model_id}", timeout=10).json()["model"]
        assert lm["info"]["source_run_id"] == mv["run_id"]
        mlmodel = requests.get(f"{url}/ajax-api/2.0/mlflow/logged-models/{model_id}/artifacts/files",
                               params={"artifact_file_path": "MLmodel"}, timeout=10)  # what the UI fetches
        assert mlmodel.status_code == 200 and "transformers" in mlmodel.text, mlmodel.text[:500]
        # and a client of that server loads the model (artifacts under the one artifact root)
        out = subprocess.run([sys.executable, "-c", "import mlflow, sys; p = mlflow.transformers.load_model("
                              f"'models:/{MODEL}@champion'); print(type(p).__name__)"],
                             env={**os.environ, "MLFLOW_TRACKING_URI": url}, capture_output=True, text=True,
                             timeout=300)
        assert out.stdout.strip().endswith("TextGenerationPipeline"), out.stderr[-2000:]
    finally:
        stop_process(proc)


def test_temper_train_register_as_writes_a_logged_model_too(registry):
    import mlflow

    from infra.tracking.runs import use_experiment
    from temper.training.export import log_and_register

    use_experiment("train")  # as the training callback does: artifacts under TEMPER_HOME
    with mlflow.start_run():
        version = log_and_register(registry["model_dir"], "temper-train-test")
    mv = mlflow.MlflowClient().get_model_version("temper-train-test", version)
    assert mv.source.startswith("models:/m-") and mv.tags[TAG_FORMAT] == "mlflow-transformers"
    pipe = mlflow.transformers.load_model(f"models:/temper-train-test/{version}")
    assert pipe("3 + 4 = ", max_new_tokens=5, do_sample=False, return_full_text=False)[0]["generated_text"] \
        == _greedy(registry["model_dir"], "3 + 4 = ", 5)
