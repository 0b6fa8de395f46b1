"""The training config: one pydantic model, loaded from YAML, documenting every knob.

The DeepSpeed JSON and accelerate config are generated from it (``temper.training.deepspeed``),
so a run is fully described by this file plus the data digests recorded in its checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from temper.errors import TemperError, describe_validation_error


class TrainingError(TemperError):
    """A training config, checkpoint or resume request is wrong."""


class TrainConfig(BaseModel):
    """One SFT or GRPO run."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["sft", "grpo"] = Field(description="Which trainer runs: TRL SFTTrainer or GRPOTrainer.")
    run_name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$",
                          description="Identifies the run; checkpoints live under <store>/runs/<run_name>, "
                          "and a run restarted with the same name resumes from its latest checkpoint.")
    base_model: str = Field(description="HF causal LM folder: a local path or an fsspec URI (copied to a local cache).")
    domains: list[str] = Field(default_factory=list,
                               description="Glob patterns over catalog domain names; empty means all trainable domains "
                               "(an eval-only domain named here is refused).")
    mixing_weights: dict[str, float] = Field(default_factory=dict,
                                             description="Per-domain sampling weight overriding the catalog's "
                                             "sampling_ratio (domain -> weight > 0).")
    catalog_dir: str | None = Field(default=None, description="Domain catalog directory; None means settings.catalog_dir.")
    output_dir: str = Field(description="Local working directory: checkpoints, metrics.jsonl, the exported model.")
    store_uri: str | None = Field(default=None,
                                  description="Where checkpoints are synced (local path or s3://). "
                                  "None means <settings.storage_root>/runs/<run_name>.")
    max_steps: int = Field(default=100, gt=0, description="Optimizer steps of the run.")
    learning_rate: float = Field(default=1e-4, gt=0, description="Peak learning rate of torch AdamW.")
    lr_scheduler_type: str = Field(default="constant", description="transformers scheduler name (constant, linear, cosine).")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    per_device_batch_size: int = Field(default=8, gt=0,
                                       description="Samples per rank per step (for GRPO: completions, "
                                       "i.e. prompts x num_generations / world_size).")
    seed: int = Field(default=0, description="Seeds the model init RNG, the domain sampler and data order.")
    max_length: int = Field(default=128, gt=0, description="SFT: prompt+completion tokens kept per sample.")
    num_generations: int = Field(default=4, ge=2, description="GRPO: completions sampled per prompt (group size).")
    max_completion_length: int = Field(default=8, gt=0, description="GRPO: new tokens generated per completion.")
    temperature: float = Field(default=1.0, gt=0, description="GRPO: sampling temperature of generation.")
    beta: float = Field(default=0.04, ge=0, description="GRPO: KL coefficient against the reference model (0 = no ref model).")
    world_size: int = Field(default=2, ge=1, description="Processes (ranks) started by accelerate launch.")
    deepspeed: bool = Field(default=True, description="Run under DeepSpeed ZeRO-3; False = plain single-process torch.")
    save_steps: int = Field(default=50, gt=0, description="Checkpoint every N steps (ZeRO-3 partitions + optimizer + RNG).")
    save_total_limit: int = Field(default=2, gt=0, description="Checkpoints kept locally and in the store (last K).")
    resume: Literal["auto", "never"] = Field(default="auto",
                                             description="'auto' resumes from the run's latest checkpoint when one exists.")
    allow_dataset_change: bool = Field(default=False,
                                       description="Resume even if a dataset digest differs from the checkpoint's "
                                       "(the sampler restarts over the new data). Otherwise it is an error.")
    export: bool = Field(default=True, description="Consolidate the final weights into <output_dir>/model (safetensors).")
    register_as: str | None = Field(default=None, description="MLflow registered model name; None = log metrics only.")
    mlflow_experiment: str = Field(default="temper-train", description="MLflow experiment for metrics (when tracking is set).")
    tracking: bool = Field(default=True, description="Log rank-0 metrics to MLflow (the configured server, else the embedded sqlite).")
    log_shards: bool = Field(default=True, description="Write each rank's parameter-partition sizes to shards-rank<k>.json.")

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.mode == "grpo" and (self.per_device_batch_size * self.world_size) % self.num_generations:
            raise ValueError(f"per_device_batch_size*world_size ({self.per_device_batch_size * self.world_size}) "
                             f"must be divisible by num_generations ({self.num_generations})")
        bad = {d: w for d, w in self.mixing_weights.items() if w <= 0}
        if bad:
            raise ValueError(f"mixing_weights must be > 0, got {bad}")
        if not self.deepspeed and self.world_size != 1:
            raise ValueError("deepspeed=false runs a single process: set world_size: 1")
        return self

    @property
    def prompts_per_step(self) -> int:
        if self.mode == "sft":
            return self.per_device_batch_size * self.world_size
        return self.per_device_batch_size * self.world_size // self.num_generations


def load_config(path: str | Path, overrides: dict | None = None) -> TrainConfig:
    """Read a YAML config; errors name the file and the field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise TrainingError(f"{path}: cannot read training config: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise TrainingError(f"{path}: malformed YAML: {e}") from None
    if not isinstance(raw, dict):
        raise TrainingError(f"{path}: expected a mapping of config fields, got {type(raw).__name__}")
    raw.update(overrides or {})
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as e:
        raise TrainingError(describe_validation_error(path, e)) from None
