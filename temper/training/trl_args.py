"""temper's training settings as TRL's arguments: the one place each setting is translated.

``TrainConfig`` and its stage settings (``config.py``) are what the flow's form, the YAML files and
``temper train`` name; TRL's ``SFTConfig``/``GRPOConfig`` are what the trainers read. The tables
below say which temper name becomes which TRL argument (most keep their name); ``trl_config``
applies them, adds the placement (device, precision, DeepSpeed) and the arguments temper fixes.
A stage setting missing from every table is a test failure (tests/unit/test_trl_args.py).
"""

from __future__ import annotations

import copy
from typing import Any

from temper.training.config import GRPOSettings, StageSettings, TrainConfig
from temper.training.device import Placement

# Stage setting -> TRL argument. save_steps goes through StageSettings.checkpoint_every (empty = max_steps // 2).
STAGE_ARGS = {
    "max_steps": "max_steps",
    "learning_rate": "learning_rate",
    "lr_scheduler_type": "lr_scheduler_type",
    "warmup_steps": "warmup_steps",
    "weight_decay": "weight_decay",
    "per_device_batch_size": "per_device_train_batch_size",
    "save_steps": "save_steps",
    "save_total_limit": "save_total_limit",
    "max_length": "max_length",  # SFT
    "num_generations": "num_generations",  # GRPO from here on
    "max_completion_length": "max_completion_length",
    "temperature": "temperature",
    "beta": "beta",
}
# Run setting (TrainConfig) -> TRL arguments: the seed seeds both the model init and the data order.
RUN_ARGS = {"output_dir": ("output_dir",), "seed": ("seed", "data_seed")}
# GRPO's generation settings -> TRL arguments, with generation 'vllm' only (``generation_kwargs``).
GENERATION_ARGS = {"generation": ("use_vllm", "vllm_mode"), "vllm_server_url": ("vllm_server_base_url",)}
# Stage settings TRL never sees, and who reads them instead.
NOT_TRL = {"timeout_s": "the launcher's wall-clock limit (JobSpec.timeout_s)",
           "curriculum": "temper's domain sampler (curriculum.py)"}

# What temper fixes, whatever the settings: one optimizer step per batch, a log line and a metrics row
# per step, checkpoints by steps, no TRL reporting (temper's callback logs to MLflow), torch AdamW, the
# stream consumed in order (it is already mixed and seeded), and the Trainer adopting temper's PartialState.
FIXED = {"gradient_accumulation_steps": 1, "logging_steps": 1, "save_strategy": "steps", "report_to": [],
         "optim": "adamw_torch", "fp16": False, "dataloader_num_workers": 0, "disable_tqdm": True,
         "train_sampling_strategy": "sequential", "remove_unused_columns": False,
         "accelerator_config": {"use_configured_state": True}}
FIXED_SFT = {"completion_only_loss": True, "packing": False}
FIXED_GRPO = {"shuffle_dataset": False, "log_completions": False}


def generation_kwargs(grpo: GRPOSettings) -> dict[str, Any]:
    """The GRPOConfig options of ``generation`` (the engine needs none: it is the rollout_func).

    'vllm' is TRL's own server mode, which pushes the weights to the server after every optimizer
    step (``VLLMGeneration.sync_weights``: gathered under ZeRO-3, broadcast over NCCL, the server's
    prefix cache reset). Written to TRL 1.16's documented options; it needs a GPU vLLM server
    (`trl vllm-serve`), so it has not run here.
    """
    if grpo.generation != "vllm":
        return {}
    return {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": grpo.vllm_server_url}


def stage_kwargs(stage: StageSettings) -> dict[str, Any]:
    """The TRL arguments of a stage's settings, by STAGE_ARGS."""
    values = {**stage.model_dump(include=set(STAGE_ARGS)), "save_steps": stage.checkpoint_every}
    return {STAGE_ARGS[name]: value for name, value in values.items()}


def trl_kwargs(cfg: TrainConfig, ds_json: str | None, placement: Placement) -> dict[str, Any]:
    """Every keyword argument of the run's SFTConfig/GRPOConfig; device and precision are the placement's."""
    kwargs: dict[str, Any] = {trl: getattr(cfg, name) for name, trls in RUN_ARGS.items() for trl in trls}
    kwargs.update(stage_kwargs(cfg.stage), deepspeed=ds_json, bf16=placement.bf16,
                  use_cpu=not placement.cuda and not cfg.deepspeed, **copy.deepcopy(FIXED))
    if cfg.mode == "sft":
        return {**kwargs, **FIXED_SFT}
    return {**kwargs, **FIXED_GRPO, **generation_kwargs(cfg.grpo)}


def trl_config(cfg: TrainConfig, ds_json: str | None, placement: Placement):
    """The TRL config of the run: SFTConfig or GRPOConfig of ``trl_kwargs``."""
    # lazy: trl (200 ms) would load in fast unit tests (test_domain_roles.py)
    from trl import GRPOConfig, SFTConfig

    return (SFTConfig if cfg.mode == "sft" else GRPOConfig)(**trl_kwargs(cfg, ds_json, placement))
