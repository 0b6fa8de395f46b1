"""The training configuration, once: stage settings shared by the flow's form and the trainer.

``SFTSettings`` and ``GRPOSettings`` are the knobs of one training stage. The post_training
flow takes them as parameters (the Prefect UI renders them as the run form) and passes the
same objects into ``TrainConfig``, which ``temper train`` also reads from YAML: one set of
names and defaults from the form to the TRL config (``temper.training.trl_args``). The
checks that involve several fields (GRPO group divisibility, mixing weights, DeepSpeed vs
world size) are functions here, run by both ``TrainConfig`` and ``PostTrainingParams``,
so a flow run with an impossible combination fails at parameter validation, before compute.

The DeepSpeed JSON and accelerate config are generated from a TrainConfig
(``temper.training.deepspeed``), so a run is fully described by its file plus the data
digests recorded in its checkpoints.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from temper.core.config_files import parse_config, read_yaml
from temper.core.errors import TrainingError  # noqa: F401 (re-exported: where training code imports it from)
from temper.training.device import CPU_WORLD_SIZE, Precision, resolve_world_size


# domain -> sampling weight; a weight of 0 would silently drop a domain, so it must be > 0.
MixingWeights = dict[str, Annotated[float, Field(gt=0)]]

# where GRPO samples its rollouts (GRPOSettings.generation)
Generation = Literal["trainer", "engine", "vllm"]

# ranks of a run: a number, or 'auto', resolved when a config or the form is validated (resolve_world_size)
WorldSize = Annotated[Annotated[int, Field(ge=1)] | Literal["auto"], AfterValidator(resolve_world_size)]
WORLD_SIZE_HELP = (f"Training processes (ranks). 'auto': one per GPU this machine sees, {CPU_WORLD_SIZE} on a machine "
                   "without GPUs. On a GPU machine more ranks than GPUs are refused before anything starts.")
PRECISION_HELP = ("Training precision. 'auto': bf16 on GPUs that have it (DeepSpeed's bf16 block, the Trainer's bf16 "
                  "autocast; fp32 master weights), fp32 on CPU. 'fp32' or 'bf16' force one.")

Scheduler = Literal["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial",
                    "inverse_sqrt"]


class StageSettings(BaseModel):
    """Optimisation knobs every training stage has (the subclasses set each stage's defaults)."""

    model_config = ConfigDict(extra="forbid")

    # max_steps, learning_rate and per_device_batch_size: no default here, each stage sets its own.
    max_steps: int = Field(ge=1, description="Optimizer steps of the stage.")
    learning_rate: float = Field(gt=0, description="Peak learning rate of torch AdamW.")
    lr_scheduler_type: Scheduler = Field(default="constant", description="Learning-rate schedule after warmup.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    per_device_batch_size: int = Field(ge=1, description="Samples per rank per step.")
    save_steps: int | None = Field(default=None, ge=1,
                                   description="Checkpoint every N steps (ZeRO-3 partitions + optimizer + RNG); "
                                   "empty = once half-way (max_steps // 2).")
    save_total_limit: int = Field(default=2, ge=1, description="Checkpoints kept locally and in the store (last K).")
    timeout_s: int = Field(default=6 * 3600, ge=1,
                           description="Wall-clock limit of the training job; the launcher then kills every rank.")

    @property
    def checkpoint_every(self) -> int:
        return self.save_steps or max(1, self.max_steps // 2)


class SFTSettings(StageSettings):
    """Supervised fine-tuning on each record's ``reference`` column."""

    max_steps: int = Field(default=150, ge=1, description="Optimizer steps of SFT.")
    learning_rate: float = Field(default=3e-3, gt=0, description="Peak learning rate of SFT.")
    per_device_batch_size: int = Field(default=16, ge=1, description="Prompt+reference samples per rank per step.")
    max_length: int = Field(default=128, ge=1, description="Prompt+completion tokens kept per sample.")


class CurriculumSettings(BaseModel):
    """Online domain curriculum of GRPO (``temper.training.curriculum``): why and how it reweights.

    A group whose G completions all get the same reward has zero advantage, so it costs a rollout
    and teaches nothing; at hundreds of domains many are solved or hopeless for the current model.
    With ``enabled``, each domain's recent pass rate and recent signal rate s (the fraction of its
    groups whose rewards were not all equal; decayed counts over its last ~``window`` sampled steps)
    are tracked, and s sets a multiplier on its base sampling ratio:
    ``min_multiplier + (1 - min_multiplier) * s``. Solved (pass rate 1) and hopeless (0) domains have
    s = 0 and sink to the floor; the target band is where groups really split, which the pass rate
    alone cannot tell (prompts each always or never solved give a mid pass rate and no signal;
    partial credit gives signal at pass rate 0). An unseen domain counts as s = 1, so it is tried.
    Each domain's share stays within [min_multiplier, 1/min_multiplier] x its base share: none
    starves, none takes over. Off by default: the stream is then exactly the fixed one.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="Reweight domains toward those neither solved nor hopeless "
                          "(by their recent GRPO pass rate). Off = the fixed stratified mix.")
    window: float = Field(default=4.0, ge=1, description="Sampled steps of a domain its recent pass and signal "
                          "rates average over (older ones decay by 1 - 1/window each time the domain is seen).")
    min_multiplier: float = Field(default=0.1, gt=0, le=1,
                                  description="Floor of a domain's multiplier (peak 1): a solved or hopeless "
                                  "domain keeps at least this fraction of its weight, so no domain starves.")


class GRPOSettings(StageSettings):
    """Multi-domain GRPO: sampled completions scored by each domain's verifier."""

    max_steps: int = Field(default=40, ge=1, description="GRPO optimizer steps.")
    learning_rate: float = Field(default=3e-4, gt=0, description="Peak learning rate of GRPO.")
    per_device_batch_size: int = Field(default=8, ge=1,
                                       description="Completions per rank per step (prompts x num_generations / ranks).")
    num_generations: int = Field(default=4, ge=2, description="Completions sampled per prompt (group size G).")
    max_completion_length: int = Field(default=4, ge=1, description="Longest sampled completion, in tokens.")
    temperature: float = Field(default=0.8, gt=0, description="Sampling temperature of the rollouts.")
    beta: float = Field(default=0.0, ge=0, description="KL coefficient against the reference model (0 = no ref model).")
    curriculum: CurriculumSettings = Field(default_factory=CurriculumSettings,
                                           description="Online domain curriculum by recent pass rate (off by default).")
    generation: Generation = Field(
        default="trainer",
        description="Where rollouts are sampled. 'trainer': TRL's own generate with the gathered weights. "
        "'engine': the embedded rollout engine in each rank's process (prefix-shared KV of a group's prompt, "
        "chunked prefill), its copy of the weights synced from the policy after every optimizer step "
        "(temper.training.engine_rollouts). 'vllm': a TRL vLLM server (`trl vllm-serve`) at vllm_server_url, "
        "weights pushed by TRL after every step; single-turn domains only, needs a GPU server, untested here.")
    vllm_server_url: str | None = Field(default=None, description="generation 'vllm': base URL of the "
                                        "`trl vllm-serve` server, e.g. http://vllm:8000.")

    @model_validator(mode="after")
    def _check_generation(self) -> "GRPOSettings":
        if self.generation == "vllm" and not self.vllm_server_url:
            raise ValueError("generation 'vllm' needs vllm_server_url (the `trl vllm-serve` server, "
                             "e.g. http://vllm:8000)")
        if self.generation != "vllm" and self.vllm_server_url:
            raise ValueError(f"vllm_server_url is set but generation is {self.generation!r}: set generation: vllm "
                             "or remove it")
        return self


def check_grpo_batch(grpo: GRPOSettings, world_size: int, where: str = "grpo") -> None:
    """A step's completions must split into whole groups of num_generations."""
    total = grpo.per_device_batch_size * world_size
    if total % grpo.num_generations:
        raise ValueError(f"{where}.per_device_batch_size x world_size ({grpo.per_device_batch_size} x {world_size} "
                         f"= {total}) must be divisible by {where}.num_generations ({grpo.num_generations})")


def check_mixing_names(mixing_weights: dict[str, float], domains: list[str]) -> None:
    """A weight for a domain the run does not select would be silently unused (or fail mid-run)."""
    if not domains:
        return  # all domains
    stray = sorted(n for n in mixing_weights if not any(fnmatch.fnmatchcase(n, p) for p in domains))
    if stray:
        raise ValueError(f"mixing_weights name domains not selected by domains {domains}: {', '.join(stray)}")


def check_deepspeed(deepspeed: bool, world_size: int) -> None:
    if not deepspeed and world_size != 1:
        raise ValueError("deepspeed=false runs a single process: set world_size: 1")


class TrainConfig(BaseModel):
    """One SFT or GRPO run: where it runs and on what, plus the settings of its stage (``sft:`` or ``grpo:``)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["sft", "grpo"] = Field(description="Which trainer runs (TRL SFTTrainer or GRPOTrainer), and so "
                                         "which settings section is read: `sft:` or `grpo:`.")
    run_name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$",
                          description="Identifies the run; checkpoints live under <store>/runs/<run_name>, "
                          "and a run restarted with the same name resumes from its latest checkpoint.")
    base_model: str = Field(description="HF causal LM folder: a local path or an fsspec URI (copied to a local cache).")
    domains: list[str] = Field(default_factory=list,
                               description="Glob patterns over catalog domain names; empty means all trainable domains "
                               "(an eval-only domain named here is refused).")
    mixing_weights: MixingWeights = Field(default_factory=dict,
                                          description="Per-domain sampling weight overriding the catalog's "
                                          "sampling_ratio (domain -> weight > 0).")
    catalog_dir: str | None = Field(default=None, description="Domain catalog directory; None means settings.catalog_dir.")
    expected_digests: dict[str, str] = Field(
        default_factory=dict,
        description="Domain -> sha256 of the dataset its contract passed (the flow fills it in). A dataset whose "
        "bytes differ when training reads it is refused before the first step: it changed after validation.")
    output_dir: str = Field(description="Local working directory: checkpoints, metrics.jsonl, the exported model.")
    store_uri: str | None = Field(default=None,
                                  description="Where checkpoints are synced (local path or s3://). "
                                  "None means <settings.storage_root>/runs/<run_name>.")
    seed: int = Field(default=0, description="Seeds the model init RNG, the domain sampler and data order.")
    world_size: WorldSize = Field(default="auto", validate_default=True, description=WORLD_SIZE_HELP)
    precision: Precision = Field(default="auto", description=PRECISION_HELP)
    deepspeed: bool | Literal["auto"] = Field(
        default="auto", description="Run under DeepSpeed ZeRO-3; False = plain single-process torch. 'auto': ZeRO-3 "
        "when world_size > 1 (one rank has nothing to shard: ZeRO-3 would only add its gathers), as the flow does.")
    sft: SFTSettings | None = Field(default=None, description="Settings when mode is sft (defaults if absent).")
    grpo: GRPOSettings | None = Field(default=None, description="Settings when mode is grpo (defaults if absent).")
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
        other = "grpo" if self.mode == "sft" else "sft"
        if getattr(self, other) is not None:
            raise ValueError(f"mode is {self.mode!r} but the file has a '{other}:' section; "
                             f"rename it to '{self.mode}:' or set mode: {other}")
        if self.mode == "sft" and self.sft is None:
            self.sft = SFTSettings()
        if self.mode == "grpo":
            self.grpo = self.grpo or GRPOSettings()
            check_grpo_batch(self.grpo, self.world_size)
        check_mixing_names(self.mixing_weights, self.domains)
        if self.deepspeed == "auto":
            self.deepspeed = self.world_size > 1
        check_deepspeed(self.deepspeed, self.world_size)
        return self

    @property
    def stage(self) -> SFTSettings | GRPOSettings:
        """The settings of this run's mode."""
        return self.sft if self.mode == "sft" else self.grpo  # type: ignore[return-value]

    @property
    def prompts_per_step(self) -> int:
        if self.mode == "sft":
            return self.stage.per_device_batch_size * self.world_size
        return self.stage.per_device_batch_size * self.world_size // self.grpo.num_generations

    def to_yaml_dict(self) -> dict:
        """The file form: every field, without the unused stage section."""
        return self.model_dump(mode="json", exclude={"grpo" if self.mode == "sft" else "sft"})


def nest_stage_fields(fields: dict) -> dict:
    """A TrainConfig dict from flat fields (scripts, tests): the stage's own fields go under its section."""
    stage_model = SFTSettings if fields.get("mode") == "sft" else GRPOSettings
    out = {k: v for k, v in fields.items() if k not in stage_model.model_fields}
    out[fields["mode"]] = {**fields.get(fields["mode"], {}),
                           **{k: v for k, v in fields.items() if k in stage_model.model_fields}}
    return out


def load_config(path: str | Path, max_steps: int | None = None, mode: str | None = None) -> TrainConfig:
    """A training config YAML (``max_steps`` overrides the stage's); ``mode``: the one the command asked for.

    Errors name the file and the field, in the format of every temper config file.
    """
    if max_steps is not None and max_steps < 1:  # the flag is wrong, not the file: say so before reading it
        raise TrainingError(f"--max-steps must be >= 1, got {max_steps} (it overrides the config's max_steps)")
    raw = read_yaml(path, TrainingError, "training config")
    if isinstance(raw, dict):
        if mode is not None and raw.get("mode") in ("sft", "grpo") and raw["mode"] != mode:
            article = {"sft": "an SFT", "grpo": "a GRPO"}
            raise TrainingError(f"{path}: {article[raw['mode']]} config (mode: {raw['mode']}), but the command is "
                                f"`train {mode}`: run `temper train {raw['mode']} --config {path}` or pass "
                                f"{article[mode]} config")
        if max_steps is not None and raw.get("mode") in ("sft", "grpo"):
            section = raw.get(raw["mode"])
            raw[raw["mode"]] = {**(section if isinstance(section, dict) else {}), "max_steps": max_steps}
    return parse_config(raw, TrainConfig, path, TrainingError, "training config")
