"""Typed parameters of the lifecycle flows: what the Prefect UI renders as the run form.

One source of truth: the flows take these models, the deployments' parameter schemas are
generated from them, and `temper demo` fills them with the embedded defaults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from temper.registry.gate import PromotionPolicy


class SFTSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="Run supervised fine-tuning on the `reference` column first.")
    max_steps: int = Field(default=150, ge=1, description="Optimizer steps of SFT.")
    learning_rate: float = Field(default=3e-3, gt=0, description="Peak learning rate of SFT.")
    batch_size: int = Field(default=16, ge=1, description="Per-rank batch size of SFT.")


class GRPOSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=40, ge=1, description="GRPO optimizer steps.")
    num_generations: int = Field(default=4, ge=2, description="Completions sampled per prompt (group size G).")
    batch_size: int = Field(default=8, ge=1, description="Per-rank completions per step (prompts x G / ranks).")
    learning_rate: float = Field(default=3e-4, gt=0, description="Peak learning rate of GRPO.")
    beta: float = Field(default=0.0, ge=0, description="KL coefficient against the reference model (0 = no ref model).")
    max_completion_length: int = Field(default=4, ge=1, description="Longest sampled completion, in tokens.")
    temperature: float = Field(default=0.8, gt=0, description="Sampling temperature of the rollouts.")


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domains: list[str] | None = Field(default=None, description="Eval suite (names or globs); None = the trained domains.")
    limit: int = Field(default=64, ge=1, description="Eval records per domain (from its eval split).")
    max_new_tokens: int = Field(default=8, ge=1, description="Greedy tokens generated per eval prompt.")


class PostTrainingParams(BaseModel):
    """Everything one post-training run needs; defaults are the embedded demo."""

    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(default="temper-demo", description="Registered model name in MLflow.")
    base_model: str = Field(default="tiny", description="HF folder, fsspec URI, or 'tiny' (made by `temper model init-tiny`).")
    domains: list[str] = Field(default_factory=lambda: ["arithmetic", "multiplication"],
                               description="Domains to train on (names or globs over the catalog).")
    mixing_weights: dict[str, float] = Field(default_factory=dict,
                                             description="Override of catalog sampling ratios, domain -> weight.")
    sft: SFTSettings = Field(default_factory=SFTSettings)
    grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    promotion: PromotionPolicy = Field(default_factory=PromotionPolicy)
    backend: Literal["local", "kubernetes"] = Field(default="local", description="Where training and eval jobs run.")
    world_size: int = Field(default=2, ge=1, description="Training processes (ZeRO-3 ranks).")
    seed: int = Field(default=0, description="Seed of sampling, data order and initialisation.")


class EvaluateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(default="temper-demo", description="Registered model name.")
    version: str = Field(default="champion", description="Version number or alias to evaluate.")
    eval: EvalSettings = Field(default_factory=EvalSettings)


class ValidateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domains: list[str] | None = Field(default=None, description="Names or globs; None = the whole catalog.")


class RetrainParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    post_training: PostTrainingParams = Field(default_factory=PostTrainingParams)
    force: bool = Field(default=False, description="Run even when no dataset changed since the champion.")


def load_params(path: str) -> PostTrainingParams:
    """PostTrainingParams from a YAML/JSON file; errors name the file and the field."""
    from pathlib import Path

    import yaml
    from pydantic import ValidationError

    from temper.errors import TemperError, describe_validation_error

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TemperError(f"{path}: cannot read parameters: {e}") from None
    try:
        return PostTrainingParams.model_validate(raw or {})
    except ValidationError as e:
        raise TemperError(describe_validation_error(path, e)) from None
