"""Typed parameters of the lifecycle flows: what the Prefect UI renders as the run form.

One source of truth: the flows take these models, the deployments' parameter schemas are
generated from them, and `temper demo` fills them with the embedded defaults. The training
stages are the trainer's own settings (``temper.training.config``): what the form shows is
what ``TrainConfig`` gets, and every cross-field check runs when the parameters are
validated, i.e. when a flow run starts, before any compute.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from temper.core.config_files import load_config
from temper.core.errors import TemperError
from temper.core.settings import Backend, get_settings
from temper.registry.gate import PromotionPolicy
from temper.training.config import (
    PRECISION_HELP,
    WORLD_SIZE_HELP,
    GRPOSettings,
    MixingWeights,
    SFTSettings,
    WorldSize,
    check_grpo_batch,
    check_mixing_names,
)
from temper.training.device import Precision

__all__ = ["EvalSettings", "EvaluateParams", "GRPOSettings", "PostTrainingParams", "RetrainParams", "SFTSettings",
           "SFTStage", "ValidateParams", "load_params"]


class SFTStage(SFTSettings):
    """The flow's SFT stage: the trainer's SFTSettings plus whether the stage runs at all."""

    enabled: bool = Field(default=True, description="Run supervised fine-tuning on the `reference` column first.")


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domains: list[str] | None = Field(default=None, description="Eval suite (names or globs); None = the run's domains except role 'train' ones (eval-only benchmarks included).")
    limit: int = Field(default=64, ge=1, description="Eval records per domain (from its eval split).")
    max_new_tokens: int = Field(default=8, ge=1, description="Greedy tokens generated per eval prompt.")
    shards: int = Field(default=1, ge=1, description="Eval processes (Kubernetes: Jobs) per model, each loading the "
                        "model once and taking every shards-th domain.")
    reuse_base: bool = Field(default=True, description="post_training: a domain's base-model result computed by an "
                             "earlier run with the same model bytes, dataset, limit, max_new_tokens and code is "
                             "recorded from the store instead of evaluated again (a scheduled retrain re-scores "
                             "only its candidate).")


class PostTrainingParams(BaseModel):
    """Everything one post-training run needs; defaults are the embedded demo."""

    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(default="temper-demo", description="Registered model name in MLflow.")
    base_model: str = Field(default="tiny", description="HF folder, fsspec URI, or a named base made once: 'tiny' (a "
                            "tiny random model) or 'smollm2' (SmolLM2-135M-Instruct, after `make realistic`).")
    domains: list[str] = Field(default_factory=lambda: ["arithmetic", "multiplication"],
                               description="Domains of the run (names or globs over the catalog): trained, except eval-only "
                               "ones (role 'eval'), which are validated and evaluated only.")
    held_out: list[str] = Field(default_factory=list,
                                description="Domains (names or globs) validated and evaluated but never trained, "
                                "to measure transfer; a domain matched here and in `domains` is held out.")
    mixing_weights: MixingWeights = Field(default_factory=dict,
                                          description="Override of catalog sampling ratios, domain -> weight > 0.")
    sft: SFTStage = Field(default_factory=SFTStage)
    grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    promotion: PromotionPolicy = Field(default_factory=PromotionPolicy)
    backend: Backend | None = Field(
        default=None, description="Where training, eval and sandbox jobs run: local processes or a Kubernetes "
        "cluster. Empty = the TEMPER_BACKEND setting of the process the flow run starts in.")
    world_size: WorldSize = Field(default="auto", validate_default=True,
                                  description=WORLD_SIZE_HELP + " More than 1 trains under DeepSpeed ZeRO-3.")
    precision: Precision = Field(default="auto", description=PRECISION_HELP)
    seed: int = Field(default=0, description="Seed of sampling, data order and initialisation.")

    @model_validator(mode="after")
    def _check(self) -> "PostTrainingParams":
        check_grpo_batch(self.grpo, self.world_size)
        check_mixing_names(self.mixing_weights, self.domains)
        return self

    def resolved(self) -> "PostTrainingParams":
        """These parameters with ``backend`` filled from settings when empty: called once, as the flow starts
        (not at import or deploy time, so a deployment's form never bakes in the deploying machine's setting)."""
        if self.backend is not None:
            return self
        return self.model_copy(update={"backend": get_settings().backend})


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
    force: bool = Field(default=False, description="Run even when no dataset changed since the latest version was trained.")


def load_params(path: str) -> PostTrainingParams:
    """PostTrainingParams from a YAML/JSON file; errors name the file and the field."""
    return load_config(path, PostTrainingParams, TemperError, "parameters")
