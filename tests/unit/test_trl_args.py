"""temper's settings -> TRL's arguments (temper.training.trl_args), through the real TRL config classes."""

from __future__ import annotations

import pytest

from temper.training.config import GRPOSettings, SFTSettings, TrainConfig
from temper.training.device import Placement
from temper.training.trl_args import (
    GENERATION_ARGS,
    NOT_TRL,
    RUN_ARGS,
    STAGE_ARGS,
    generation_kwargs,
    trl_config,
)

CPU = Placement("cpu", "gloo", "fp32")


@pytest.fixture(autouse=True)
def state():
    """As temper.training.run.train configures it before building the TRL config (use_configured_state)."""
    from accelerate import PartialState

    yield PartialState(cpu=True)
    PartialState._reset_state()


def config(mode: str, tmp_path, **stage) -> TrainConfig:
    return TrainConfig(mode=mode, run_name="r", base_model="/m", output_dir=str(tmp_path), world_size=1,
                       deepspeed=False, seed=7, **{mode: stage})


def test_every_stage_setting_is_either_a_trl_argument_or_named_as_temper_own():
    """A new setting left out of the tables would reach neither TRL nor a reader of trl_args.py."""
    settings = set(SFTSettings.model_fields) | set(GRPOSettings.model_fields)
    tables = [set(STAGE_ARGS), set(GENERATION_ARGS), set(NOT_TRL)]
    assert set().union(*tables) == settings
    assert sum(map(len, tables)) == len(settings)  # each in exactly one table
    assert set(RUN_ARGS) <= set(TrainConfig.model_fields)


@pytest.mark.parametrize("mode", ["sft", "grpo"])
def test_the_defaults_build_the_trl_config_with_each_setting_where_the_table_says(mode, tmp_path):
    from trl import GRPOConfig, SFTConfig

    cfg = config(mode, tmp_path)
    args = trl_config(cfg, None, CPU)
    assert type(args) is (SFTConfig if mode == "sft" else GRPOConfig)
    for name, trl_name in STAGE_ARGS.items():
        if name in type(cfg.stage).model_fields:
            expected = cfg.stage.checkpoint_every if name == "save_steps" else getattr(cfg.stage, name)
            got = getattr(args, trl_name)
            assert getattr(got, "value", got) == expected, (name, trl_name)  # lr_scheduler_type: TRL's enum
    assert args.per_device_train_batch_size == cfg.stage.per_device_batch_size  # the one renamed setting
    assert args.save_steps == cfg.stage.max_steps // 2  # save_steps empty: once half-way
    assert (args.seed, args.data_seed, args.output_dir) == (7, 7, str(tmp_path))
    assert (args.use_cpu, args.bf16, args.deepspeed, args.gradient_accumulation_steps) == (True, False, None, 1)


def test_changed_settings_land_in_trl_under_their_trl_names(tmp_path):
    args = trl_config(config("grpo", tmp_path, max_steps=7, learning_rate=1.5e-4, per_device_batch_size=6,
                             num_generations=3, max_completion_length=9, temperature=0.7, beta=0.02, save_steps=5,
                             lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.01, save_total_limit=3),
                      None, CPU)
    assert (args.max_steps, args.learning_rate, args.per_device_train_batch_size, args.save_steps) == (7, 1.5e-4, 6, 5)
    assert (args.num_generations, args.max_completion_length, args.temperature, args.beta) == (3, 9, 0.7, 0.02)
    assert (args.lr_scheduler_type.value, args.warmup_steps, args.weight_decay, args.save_total_limit) == (
        "cosine", 2, 0.01, 3)
    assert (args.shuffle_dataset, args.use_vllm) == (False, False)
    sft = trl_config(config("sft", tmp_path, max_length=64), None, CPU)
    assert (sft.max_length, sft.completion_only_loss, sft.packing) == (64, True, False)


def test_generation_vllm_is_trl_server_mode_and_the_others_add_nothing():
    vllm = generation_kwargs(GRPOSettings(generation="vllm", vllm_server_url="http://v:8000"))
    assert vllm == {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://v:8000"}
    assert set(vllm) == {trl for trls in GENERATION_ARGS.values() for trl in trls}
    assert generation_kwargs(GRPOSettings(generation="engine")) == {}  # the engine is the rollout_func
    assert generation_kwargs(GRPOSettings()) == {}
