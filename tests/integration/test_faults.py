"""Faults around a real post_training run: the tracking server goes away and comes back.

The MLflow server here is the test's own (not the session's), so it can be stopped and started
again on the same port and the same sqlite store, as an operator restarting it would.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from temper.core.tag_names import PARENT_TAG, TAG_STAGE
from tests.integration.conftest import generate

pytestmark = pytest.mark.slow


def test_mlflow_down_during_grpo_loses_nothing_and_the_run_finishes(own_mlflow):
    """The server is stopped after GRPO's first logged step and started again 20 s later on the same
    store. MLflow's client retries (7 with exponential backoff: ~4 min) carry the training job's
    logging over the gap; every GRPO step's loss is in the store, and the lifecycle run ends FINISHED."""
    from mlflow.tracking import MlflowClient

    from flows.post_training import post_training
    from temper.lifecycle.params import EvalSettings, GRPOSettings, PostTrainingParams, SFTStage

    steps = 8
    outage: dict[str, float] = {}

    def cut_the_server() -> None:
        deadline = time.monotonic() + 900
        while own_mlflow.grpo_steps_logged() < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        own_mlflow.stop()
        outage["stopped_at_step"] = own_mlflow.grpo_steps_logged()  # after the stop: in-flight writes are done
        time.sleep(20)
        outage["steps_while_down"] = own_mlflow.grpo_steps_logged()
        own_mlflow.start()

    saboteur = threading.Thread(target=cut_the_server, daemon=True)
    saboteur.start()
    params = PostTrainingParams(model_name="temper-faults", domains=["arithmetic"], sft=SFTStage(enabled=False),
                                grpo=GRPOSettings(max_steps=steps), eval=EvalSettings(limit=8))
    state = post_training(params, return_state=True)
    saboteur.join(timeout=60)
    assert state.is_completed(), state.message
    assert outage["stopped_at_step"] >= 1 and outage["steps_while_down"] == outage["stopped_at_step"], outage

    client = MlflowClient(own_mlflow.uri)
    lifecycle = client.get_run(state.result()["lifecycle_run_id"])
    assert lifecycle.info.status == "FINISHED"
    children = client.search_runs([lifecycle.info.experiment_id], f"tags.`{PARENT_TAG}` = '{lifecycle.info.run_id}'")
    grpo = next(r for r in children if r.data.tags.get(TAG_STAGE) == "grpo")
    assert grpo.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(grpo.info.run_id, "loss")) == list(range(1, steps + 1))
    assert {"grpo", "register"} <= {r.data.tags.get(TAG_STAGE) for r in children}


def test_s3_outage_during_checkpoint_uploads_is_retried_and_a_long_one_resumes_from_the_last_complete(
        temper_home, s3_server, s3_env, tmp_path, monkeypatch):
    """The store is moto's S3 behind a TCP proxy the test cuts. First outage: cut right after
    checkpoint 2, restored 2 s after the upload of checkpoint 4 reported it retries: the upload
    completes. Second outage: cut after checkpoint 4 and kept cut past the 12 s retry budget: the job
    fails with one line naming the upload, checkpoint 6 is never complete in the store, and a restart
    elsewhere (a fresh output folder) resumes from checkpoint 4."""
    from temper.core.settings import get_settings
    from temper.training import checkpoint as ckpt
    from temper.training.config import load_config
    from temper.training.tiny import init_tiny
    from tests.integration.tcp_proxy import CuttableProxy
    from tests.integration.test_training import launch, losses, write_config

    proxy = CuttableProxy(int(s3_server.rsplit(":", 1)[1]))
    monkeypatch.setenv("TEMPER_S3_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("TEMPER_STORE_RETRY_S", "12")
    monkeypatch.setenv("TEMPER_CATALOG_DIR", str(Path(__file__).resolve().parents[2] / "domains"))
    get_settings.cache_clear()
    generate("arithmetic")
    init_tiny(tmp_path / "tiny")
    fields = dict(mode="sft", base_model=str(tmp_path / "tiny"), domains=["arithmetic"], max_steps=6, save_steps=2)
    config = write_config(tmp_path, "s3outage", **fields)

    phase = {"n": 0}

    def saboteur(line: str) -> None:
        if phase["n"] == 0 and "checkpoint step 2 synced" in line:
            proxy.cut()
            phase["n"] = 1
        elif phase["n"] == 1 and "store unreachable during upload" in line:
            threading.Timer(2.0, proxy.restore).start()
            phase["n"] = 2
        elif phase["n"] == 2 and "checkpoint step 4 synced" in line:
            proxy.cut()
            phase["n"] = 3

    status, lines = launch(config, "sft", on_line=saboteur)
    proxy.restore()
    text = "\n".join(lines)
    assert phase["n"] == 3, text[-3000:]  # both outages happened where intended
    assert status != 0
    error = [line for line in lines if line.startswith("temper: error: ")]
    assert error and "checkpoint-6" in error[0] and "the store failed for 12 s" in error[0], text[-3000:]
    cfg = load_config(str(config), mode="sft")
    assert max(ckpt.store_checkpoints(ckpt.store_uri(cfg))) == 4  # checkpoint 6 never got its state file

    elsewhere = write_config(tmp_path, "s3outage", output_dir=str(tmp_path / "elsewhere"), **fields)
    status, lines = launch(elsewhere, "sft")
    assert status == 0, "\n".join(lines[-30:])
    assert any("resuming from" in line and "checkpoint-4" in line for line in lines)
    assert sorted(losses(tmp_path / "elsewhere")) == [5, 6]
