"""The job spec of a training run: what any launcher (local processes, Kubernetes) starts."""

from __future__ import annotations

import sys
from pathlib import Path

from infra.jobspec import JobSpec, job_name
from temper.core.settings import get_settings
from temper.data.catalog import load_catalog, select_domains
from temper.training.config import TrainConfig, TrainingError, load_config
from temper.training.deepspeed import launch_env, write_launch_configs
from temper.training.device import check_world_size


def preflight(cfg: TrainConfig) -> None:
    """What can be checked here, cheaply, before ranks start: a local base model folder and the domains."""
    if "://" not in cfg.base_model and not (Path(cfg.base_model) / "config.json").exists():
        raise TrainingError(f"base_model {cfg.base_model}: no config.json there (expected an HF model folder)")
    select_domains(load_catalog(cfg.catalog_dir or get_settings().catalog_dir), cfg.domains)


def training_job(config_path: str, mode: str, max_steps: int | None = None) -> JobSpec:
    """The JobSpec that runs one training config (generated accelerate/DeepSpeed configs included).

    The config is validated here, before any rank starts: a bad field or a config of the other
    mode is one TrainingError line, not a stack trace from each rank.
    """
    cfg = load_config(config_path, max_steps=max_steps, mode=mode)
    check_world_size(cfg.world_size, f"{config_path}: world_size")  # local ranks: one per GPU at most
    command = [sys.executable, "-m", "workloads.train", mode, "--config", str(Path(config_path).resolve())]
    if max_steps:
        command += ["--max-steps", str(max_steps)]
    acc = None
    if cfg.deepspeed:
        _, acc_path = write_launch_configs(cfg, Path(cfg.output_dir) / "launch")
        acc = str(acc_path)
    return JobSpec(name=job_name(mode, cfg.run_name), kind="train", command=command, env=launch_env(cfg.world_size),
                   procs_per_node=cfg.world_size, distributed=cfg.deepspeed, accelerate_config=acc,
                   timeout_s=cfg.stage.timeout_s)
