"""The training configuration, once: flow form == trainer config, checks at validation, shipped examples load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from temper.core.errors import TemperError
from temper.lifecycle.params import GRPOSettings, PostTrainingParams, SFTStage, load_params
from temper.training.config import SFTSettings, TrainConfig, TrainingError, load_config
from tests.conftest import REPO

SHIPPED = sorted((REPO / "configs" / "train").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_training_config_loads(path):
    cfg = load_config(path)
    assert cfg.mode == path.stem and cfg.stage is not None


def test_shipped_configs_are_the_flow_defaults_and_the_k8s_jobs_point_at_them():
    """configs/train = what `temper demo` trains with; every k8s training job names an existing config."""
    assert {p.name for p in SHIPPED} == {"sft.yaml", "grpo.yaml"}
    params = PostTrainingParams()
    sft, grpo = load_config(REPO / "configs/train/sft.yaml"), load_config(REPO / "configs/train/grpo.yaml")
    assert sft.stage.model_dump() == params.sft.model_dump(exclude={"enabled"})
    assert grpo.stage == params.grpo
    for cfg in (sft, grpo):
        assert (cfg.domains, cfg.world_size, cfg.seed) == (params.domains, params.world_size, params.seed)
    for k8s in (REPO / "configs" / "k8s").glob("*.yaml"):
        command = yaml.safe_load(k8s.read_text())["job"]["command"]
        if "workloads.train" in command:
            config = command[command.index("--config") + 1]
            assert load_config(REPO / config).mode == command[command.index("workloads.train") + 1], k8s.name


def test_flow_stage_settings_are_the_trainer_settings_unchanged():
    """A stage's TrainConfig carries the form's stage settings as they are (their values: the models' defaults)."""
    from tasks.training import stage_config

    params = PostTrainingParams()
    sft = stage_config("sft", params, "/base", "pt-x", Path("/w"))
    grpo = stage_config("grpo", params, "/sft", "pt-x", Path("/w"))
    assert isinstance(sft.stage, SFTSettings) and not isinstance(sft.stage, SFTStage) and grpo.stage == params.grpo
    assert sft.stage.model_dump() == params.sft.model_dump(exclude={"enabled"}) == SFTSettings().model_dump()
    for cfg in (sft, grpo):
        assert (cfg.world_size, cfg.deepspeed, cfg.seed, cfg.mlflow_experiment) == (2, True, 0, "post_training")
        assert cfg.output_dir == f"/w/{cfg.mode}" and cfg.run_name == f"pt-x-{cfg.mode}"
    written = TrainConfig.model_validate(yaml.safe_load(yaml.safe_dump(grpo.to_yaml_dict())))
    assert written == grpo and "sft" not in grpo.to_yaml_dict()


def test_form_reaches_the_optimisation_knobs():
    schema = PostTrainingParams.model_json_schema()
    for stage in ("SFTStage", "GRPOSettings"):
        props = schema["$defs"][stage]["properties"]
        assert {"warmup_steps", "lr_scheduler_type", "weight_decay", "save_steps", "per_device_batch_size",
                "timeout_s"} <= set(props), stage
    assert "max_length" in schema["$defs"]["SFTStage"]["properties"]


@pytest.mark.parametrize("fields, message", [
    ({"grpo": {"per_device_batch_size": 3}}, r"per_device_batch_size x world_size \(3 x 2 = 6\) must be divisible"),
    ({"world_size": 3, "grpo": {"per_device_batch_size": 6}}, r"\(6 x 3 = 18\) must be divisible by grpo.num_g"),
    ({"mixing_weights": {"arithmetic": 0}}, "greater than 0"),
    ({"mixing_weights": {"arithmetc": 2.0}}, r"mixing_weights name domains not selected .*: arithmetc"),
    ({"sft": {"warmup_steps": -1}}, "greater than or equal to 0"),
    ({"grpo": {"lr_scheduler_type": "cosyne"}}, "cosine"),
])
def test_invalid_combinations_fail_when_the_flow_parameters_are_validated(fields, message):
    with pytest.raises(ValidationError, match=message):
        PostTrainingParams.model_validate(fields)


def test_params_and_training_files_share_one_loader_and_error_format(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("grpo:\n  per_device_batch_size: 8\n  num_generations: 3\n")
    with pytest.raises(TemperError) as e:
        load_params(str(params))
    assert str(e.value).startswith(f"{params}: field '<root>': ") and "divisible" in str(e.value)
    params.write_text("sft:\n  batch_size: 8\n")  # the old name
    with pytest.raises(TemperError, match=rf"^{params}: field 'sft.batch_size': Extra inputs are not permitted$"):
        load_params(str(params))
    params.write_text("sft: [1\n")
    with pytest.raises(TemperError, match=rf"^{params}: line 2 malformed YAML"):
        load_params(str(params))
    train = tmp_path / "t.yaml"
    train.write_text("mode: grpo\nrun_name: r\nbase_model: /m\noutput_dir: /o\ngrpo: {max_steps: 0}\n")
    with pytest.raises(TrainingError, match=rf"^{train}: field 'grpo.max_steps': Input should be greater"):
        load_config(train)
    train.write_text("mode: sft\nrun_name: r\nbase_model: /m\noutput_dir: /o\ngrpo: {max_steps: 5}\n")
    with pytest.raises(TrainingError, match="mode is 'sft' but the file has a 'grpo:' section"):
        load_config(train)


def test_max_steps_override_goes_to_the_stage():
    cfg = load_config(REPO / "configs/train/grpo.yaml", max_steps=3)
    assert cfg.stage.max_steps == 3 and cfg.grpo.num_generations == GRPOSettings().num_generations


def test_train_with_a_config_of_the_other_mode_is_one_line_and_starts_nothing(tmp_path, capsys, temper_home):
    from temper.cli import main

    cfg = yaml.safe_load((REPO / "configs/train/sft.yaml").read_text())
    cfg["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "grpo", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"temper: error: {path}: an SFT config (mode: sft), but the command is `train grpo`")
    assert not (tmp_path / "out").exists()  # no launch config, no log, no rank


def test_train_with_a_missing_base_model_or_domain_is_one_line_before_launch(tmp_path, capsys, temper_home):
    from temper.cli import main

    cfg = yaml.safe_load((REPO / "configs/train/grpo.yaml").read_text())
    cfg.update(output_dir=str(tmp_path / "out"), base_model=str(tmp_path / "nowhere"))
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "grpo", "--config", str(path)]) == 1
    assert capsys.readouterr().err == f"temper: error: base_model {tmp_path / 'nowhere'}: no config.json there " \
                                      "(expected an HF model folder)\n"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    cfg.update(base_model=str(tmp_path / "m"), domains=["arithmetc"])
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "grpo", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("temper: error: no domain matches arithmetc") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_progress_line_is_one_compact_line():
    from temper.training.progress import is_progress, progress_line

    line = progress_line("grpo", 12, 40, {"loss": 0.021346, "reward": 0.4123, "tokens_per_s": 1890.0}, 60.0, 12)
    assert line == "temper: grpo step 12/40 | loss 0.02135 | reward 0.412 | 1.9k tok/s | ETA 2:20"
    resumed = progress_line("sft", 30, 40, {"loss": 1.0}, 10.0, 5)  # resumed at 25: 2 s/step since, 10 left
    assert resumed.endswith("ETA 0:20") and is_progress(resumed)
    assert progress_line("sft", 40, 40, {"loss": 1.0}, 10.0, 5) == "temper: sft step 40/40 | loss 1"
    assert not is_progress("{'loss': '4.654', 'grad_norm': '4.874'}")


def test_curriculum_parameter_reaches_the_trainer_and_bad_values_fail_at_flow_start(tmp_path):
    """post_training's grpo.curriculum (form or parameters file) -> the GRPO job's config file -> TrainConfig."""
    from tasks.training import stage_config

    assert PostTrainingParams().grpo.curriculum.enabled is False  # off by default
    assert "curriculum" in PostTrainingParams.model_json_schema()["$defs"]["GRPOSettings"]["properties"]
    params_file = tmp_path / "params.yaml"
    params_file.write_text("grpo:\n  curriculum: {enabled: true, window: 8, min_multiplier: 0.25}\n")
    params = load_params(str(params_file))
    cfg = stage_config("grpo", params, "/sft", "pt-x", tmp_path)
    job_file = tmp_path / "grpo.yaml"  # what train_stage writes for the job
    job_file.write_text(yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False))
    curriculum = load_config(job_file).grpo.curriculum
    assert (curriculum.enabled, curriculum.window, curriculum.min_multiplier) == (True, 8, 0.25)

    params_file.write_text("grpo:\n  curriculum: {enabled: true, min_multiplier: 1.5}\n")
    with pytest.raises(TemperError, match=r"params.yaml.*grpo.curriculum.min_multiplier"):
        load_params(str(params_file))
    params_file.write_text("grpo:\n  curriculum: {enable: true}\n")  # a typo is not silently ignored
    with pytest.raises(TemperError, match=r"grpo.curriculum.enable"):
        load_params(str(params_file))


def test_generation_switch_is_one_field_from_the_form_to_the_trainer():
    schema = PostTrainingParams.model_json_schema()["$defs"]["GRPOSettings"]["properties"]
    assert schema["generation"]["default"] == "trainer" and set(schema["generation"]["enum"]) == {"trainer", "engine",
                                                                                                 "vllm"}
    with pytest.raises(ValidationError, match="generation 'vllm' needs vllm_server_url"):
        PostTrainingParams.model_validate({"grpo": {"generation": "vllm"}})
    with pytest.raises(ValidationError, match="vllm_server_url is set but generation is 'engine'"):
        GRPOSettings(generation="engine", vllm_server_url="http://v:8000")


def test_rollout_for_routes_generation_and_refuses_vllm_for_multi_step_domains():
    from temper.data.catalog import load_catalog
    from temper.training.multiturn import rollout_for

    catalog = load_catalog(REPO / "domains")
    single, multi = catalog["arithmetic"], catalog["ledger_tasks"]
    assert rollout_for([single], [], "trainer") is None and rollout_for([single], [], "vllm") is None
    engine = rollout_for([single], [], "engine")
    assert engine.use_engine and engine.names == []
    assert not rollout_for([single, multi], [], "trainer").use_engine
    with pytest.raises(ValueError, match="'vllm' supports single-turn domains only; multi-step domains .*ledger_tasks"):
        rollout_for([single, multi], [], "vllm")


def test_world_size_auto_is_the_started_jobs_size_in_a_rank_and_the_machines_elsewhere(monkeypatch):
    from temper.training.device import CPU_WORLD_SIZE, resolve_world_size, visible_gpus

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve_world_size("auto") == (visible_gpus() or CPU_WORLD_SIZE)
    assert resolve_world_size(3) == 3
    monkeypatch.setenv("WORLD_SIZE", "8")  # a rank of a job of 2 pods x 4 GPUs, whatever this pod sees
    assert resolve_world_size("auto") == 8
    cfg = load_config(REPO / "configs/train/sft.yaml")
    assert cfg.world_size == 8 and cfg.deepspeed is True
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("WORLD_SIZE")
    assert visible_gpus() == 0 and resolve_world_size("auto") == CPU_WORLD_SIZE


@pytest.mark.parametrize("mode", ["sft", "grpo"])
@pytest.mark.parametrize("steps", [0, -3])
def test_a_max_steps_flag_below_1_blames_the_flag_not_the_config(tmp_path, capsys, mode, steps):
    from temper.cli import main

    assert main(["train", mode, "--config", str(REPO / f"configs/train/{mode}.yaml"), "--max-steps", str(steps)]) == 1
    err = capsys.readouterr().err
    assert err == f"temper: error: --max-steps must be >= 1, got {steps} (it overrides the config's max_steps)\n"
