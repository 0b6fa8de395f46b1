"""One training run: data -> domain-mixed stream -> TRL SFTTrainer/GRPOTrainer -> checkpoints -> export.

Runs on every rank (started by ``accelerate launch``); rank 0 alone logs to MLflow and
exports. The stream is materialised up front from the seeded ``DomainMixSampler`` and
consumed in order (no trainer-side shuffle), exactly ``max_steps`` steps of it, so there
is no trainer epoch boundary: step s always sees slots [s*P, (s+1)*P). On resume the
Trainer skips the consumed batches and restores model/optimizer/scheduler/RNG; we check
that the sampler state replayed to that step equals the one saved in the checkpoint.
With the GRPO curriculum on, the same slots are decided online instead (``curriculum.py``:
drawn when the loader reads them, from the rewards observed so far, replayed on resume).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_callback import PrinterCallback

from infra.storage import get_fs
from temper.core.chat import chat_prompt
from temper.core.settings import Settings, get_settings
from temper.data.catalog import load_catalog, refuse_eval_only, select_domains
from temper.data.domain import Domain
from temper.training import checkpoint as ckpt
from temper.training.callbacks import TemperCallback
from temper.training.config import TrainConfig, TrainingError
from temper.training.curriculum import CurriculumStream, lazy_dataset, replay
from temper.training.deepspeed import seed_torch_extensions, write_launch_configs
from temper.training.device import configure_rank, rank_placement
from temper.training.disk import disk_full_is_named, folder_bytes
from temper.training.mixing import DomainMixSampler
from temper.training.multiturn import is_multiturn, rollout_for
from temper.training.rewards import DomainRewards
from temper.training.throughput import RolloutTimer
from temper.training.trl_args import trl_config

log = logging.getLogger("temper.train")


def resolve_model(uri: str, settings: Settings) -> str:
    """A local folder as is; any other fsspec URI is copied once into <home>/cache/models."""
    if "://" not in uri or uri.startswith("file://"):
        path = Path(uri.removeprefix("file://"))
        if not (path / "config.json").exists():
            raise TrainingError(f"base_model {uri}: no config.json there (expected an HF model folder)")
        return str(path)

    target = settings.home.resolve() / "cache" / "models" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if not (target / "config.json").exists():
        fs, path = get_fs(uri, settings)
        if not fs.exists(f"{path}/config.json"):
            raise TrainingError(f"base_model {uri}: no config.json there (expected an HF model folder)")
        tmp = target.with_suffix(".partial")
        fs.get(path.rstrip("/") + "/", str(tmp) + "/", recursive=True)
        tmp.rename(target)
    return str(target)


def load_domains(cfg: TrainConfig, settings: Settings) -> tuple[list[Domain], dict[str, Any], dict[str, str], dict[str, str]]:
    """Domains, their train splits, dataset digests and source URIs."""
    # lazy: pandas (320 ms), via datasets, would load in fast unit tests (test_domain_roles.py)
    from temper.data.datasets import load_dataset

    catalog = load_catalog(cfg.catalog_dir or settings.catalog_dir)
    if cfg.domains:  # named or globbed: an eval-only domain among them is an error, never a silent skip
        domains = select_domains(catalog, cfg.domains)
        refuse_eval_only(domains, f"run {cfg.run_name}")
    else:  # "all domains" means all that may be trained on
        domains = [d for d in select_domains(catalog, None) if d.trainable]
    frames, digests, uris = {}, {}, {}
    for d in domains:
        loaded = load_dataset(d, settings)
        frame = loaded.frame
        if d.split.column not in frame.columns:
            raise TrainingError(f"dataset {loaded.uri}: no split column {d.split.column!r}")
        frames[d.name] = frame[frame[d.split.column] == d.split.train].reset_index(drop=True)
        digests[d.name], uris[d.name] = loaded.digest, loaded.uri
    refuse_unvalidated(cfg, digests, uris)
    return domains, frames, digests, uris


def refuse_unvalidated(cfg: TrainConfig, digests: dict[str, str], uris: dict[str, str]) -> None:
    """Train only on the bytes the contracts passed: a dataset rewritten between the flow's validation
    and this job (a poisoned or half-written file) would otherwise be trained on unchecked."""
    for name, expected in sorted(cfg.expected_digests.items()):
        if name not in digests:
            raise TrainingError(f"run {cfg.run_name}: domain {name} was validated but is not among the domains "
                                f"this run trains on ({', '.join(sorted(digests))})")
        if digests[name] != expected:
            raise TrainingError(f"run {cfg.run_name}: dataset {uris[name]} of domain {name} changed after it was "
                                f"validated (validated sha256 {expected[:16]}..., now {digests[name][:16]}...): "
                                "refusing to train on unchecked data; validate it again")


def new_sampler(cfg: TrainConfig, domains: list[Domain], frames: dict[str, Any]) -> DomainMixSampler:
    unknown = sorted(set(cfg.mixing_weights) - {d.name for d in domains})
    if unknown:
        raise TrainingError(f"run {cfg.run_name}: mixing_weights name domains not trained: {', '.join(unknown)}")
    return DomainMixSampler(sizes={d.name: len(frames[d.name]) for d in domains},
                            ratios={d.name: cfg.mixing_weights.get(d.name, d.sampling_ratio) for d in domains},
                            seed=cfg.seed)


def row_renderer(cfg: TrainConfig, domains: list[Domain], frames: dict[str, Any], tokenizer: Any = None):
    """(domain, record index) -> the trainer's row: prompt, domain, and the record (GRPO) or reference (SFT).

    With a ``tokenizer`` the prompt is in its chat template (``chat_prompt``), as the eval job formats it."""
    by_name = {d.name: d for d in domains}

    def render(name: str, idx: int) -> dict[str, str]:
        record = {k: (v.item() if hasattr(v, "item") else v) for k, v in frames[name].iloc[idx].to_dict().items()}
        prompt = by_name[name].render_prompt(record)
        row = {"prompt": chat_prompt(tokenizer, prompt) if tokenizer is not None else prompt, "domain": name}
        if cfg.mode == "sft":
            row["completion"] = str(record["reference"])
        else:
            row["record"] = json.dumps(record, default=str)
        return row

    return render


def episode_rows(cfg: TrainConfig, domains: list[Domain], frames: dict[str, Any], tokenizer: Any = None) -> list[dict]:
    """Every train row a multi-step domain could put in the stream, rendered as the stream renders it: what the
    rollout looks a prompt's task up in. Not the stream itself: with the curriculum on, reading it would draw
    batches whose weights depend on rewards not yet seen."""
    render = row_renderer(cfg, domains, frames, tokenizer)
    return [render(d.name, i) for d in domains if is_multiturn(d) for i in range(len(frames[d.name]))]


def stream_slots(cfg: TrainConfig) -> int:
    return (cfg.stage.max_steps + 1) * cfg.prompts_per_step


def build_stream(cfg: TrainConfig, domains: list[Domain], frames: dict[str, Any],
                 tokenizer: Any = None) -> list[dict[str, str]]:
    """The fixed stream, materialised up front (no curriculum)."""
    render = row_renderer(cfg, domains, frames, tokenizer)
    return [render(name, idx) for name, idx in new_sampler(cfg, domains, frames).take(stream_slots(cfg))]


def curriculum_on(cfg: TrainConfig) -> bool:
    return cfg.mode == "grpo" and cfg.grpo.curriculum.enabled


def new_stream(cfg: TrainConfig, domains: list[Domain], frames: dict[str, Any], observations: list | None = None,
               step: int = 0) -> CurriculumStream:
    """The curriculum's online stream after ``step`` steps of the given observation log."""
    return replay(new_sampler(cfg, domains, frames), cfg.grpo.curriculum, cfg.prompts_per_step, observations or [],
                  step)


def sampler_state(cfg: TrainConfig, domains: list[Domain], frames: dict[str, Any],
                  stream: CurriculumStream | None, step: int) -> dict:
    """What a checkpoint at ``step`` records of the stream: replayed from scratch, so it is canonical."""
    if stream is None:
        sampler = new_sampler(cfg, domains, frames)
        sampler.take(step * cfg.prompts_per_step)
        return sampler.state_dict()
    return new_stream(cfg, domains, frames, stream.observations, step).state_dict()


def train(cfg: TrainConfig, settings: Settings | None = None) -> dict[str, Any]:
    """Run (or resume) the configured training on this rank; returns rank-local results."""
    # lazy: torch+datasets (2.4 s) would load in fast unit tests (test_domain_roles.py)
    import datasets
    import torch

    settings = settings or get_settings()
    placement = rank_placement(cfg.precision)
    configure_rank(placement)  # before DeepSpeed picks its accelerator
    if not placement.cuda:
        seed_torch_extensions()  # the image's compiled CPU comm op, before DeepSpeed would compile it
    domains, frames, digests, uris = load_domains(cfg, settings)
    model_dir = resolve_model(cfg.base_model, settings)
    ds_json = None
    if cfg.deepspeed:
        ds_path, _ = write_launch_configs(cfg, Path(cfg.output_dir) / "launch", placement)
        ds_json = str(ds_path)
    # lazy: accelerate (1.7 s) would load in fast unit tests (test_domain_roles.py)
    from accelerate import PartialState

    # The Trainer would build its own state: on CPU with no backend (world size 1) or, with use_cpu,
    # plain DDP. Configure the state first: the placement's backend (gloo on CPU, NCCL on GPUs) + DeepSpeed
    # comm (zero.Init in from_pretrained needs it), which the Trainer then adopts (use_configured_state).
    state = PartialState(backend=placement.backend) if cfg.deepspeed else PartialState(cpu=not placement.cuda)
    args = trl_config(cfg, ds_json, placement)
    resume_from, stream = None, None
    if curriculum_on(cfg):
        stream = new_stream(cfg, domains, frames)
    if cfg.resume == "auto":
        with state.local_main_process_first():
            resume_from = ckpt.latest_checkpoint(cfg, settings)
    if resume_from is not None:
        saved = ckpt.check_resume(cfg, resume_from, digests)
        if saved["dataset_changed"]:
            if stream is not None:  # the new data's stream from scratch, steered by the rewards seen so far
                stream = CurriculumStream(new_sampler(cfg, domains, frames), cfg.grpo.curriculum,
                                          cfg.prompts_per_step, saved["sampler"].get("observations", []))
            log.warning("run %s: dataset changed since %s; continuing from step %d over the NEW data "
                        "(allow_dataset_change: true)", cfg.run_name, resume_from.name, saved["step"])
        elif curriculum_on(cfg):  # replay the checkpoint's observation log: the stream it drew, exactly
            stream = new_stream(cfg, domains, frames, saved["sampler"]["observations"], saved["step"])
            if stream.state_dict() != saved["sampler"]:
                raise TrainingError(f"run {cfg.run_name}: {resume_from}: the curriculum's replayed stream differs "
                                    "from the checkpoint's (sampling ratios, seed or batch size changed); use a new "
                                    "run_name")
        else:
            replayed = sampler_state(cfg, domains, frames, None, saved["step"])
            if replayed != saved["sampler"]:
                raise TrainingError(f"run {cfg.run_name}: {resume_from}: domain sampler state differs from this "
                                    "config's (sampling ratios, seed or batch size changed); use a new run_name")
        if state.is_main_process:
            log.warning("run %s: resuming from %s", cfg.run_name, resume_from)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if stream is None:
        train_ds = datasets.Dataset.from_list(build_stream(cfg, domains, frames, tokenizer))
    else:  # decided online, batch by batch, from the curriculum's weights
        train_ds = lazy_dataset(stream, stream_slots(cfg), row_renderer(cfg, domains, frames, tokenizer))
    if resume_from is not None and saved["step"] >= cfg.stage.max_steps:
        # The stage's last checkpoint (the job died between it and the export). transformers' Trainer trains
        # one more step from a final checkpoint when its epoch has rows left (the stream holds max_steps + 1
        # steps' rows); with exactly max_steps steps' rows its epoch loop is empty: it loads the checkpoint
        # and goes straight to the end, so the export is the checkpoint's model.
        train_ds = train_ds.select(range(cfg.stage.max_steps * cfg.prompts_per_step))

    rewards, rollouts = None, None
    if cfg.mode == "sft":
        # lazy: trl (200 ms) would load in fast unit tests (test_domain_roles.py)
        from trl import SFTTrainer

        trainer = SFTTrainer(model=model, args=args, train_dataset=train_ds.remove_columns(["domain"]),
                             processing_class=tokenizer)
    else:
        # lazy: trl (200 ms) would load in fast unit tests (test_domain_roles.py)
        from trl import GRPOTrainer

        rewards = DomainRewards(domains)
        trainer = GRPOTrainer(model=model, args=args, train_dataset=train_ds, reward_funcs=[rewards],
                              processing_class=tokenizer,
                              rollout_func=rollout_for(domains, episode_rows(cfg, domains, frames, tokenizer),
                                                       cfg.grpo.generation))
        rollouts = RolloutTimer()
        rollouts.wrap(trainer)

    callback = TemperCallback(cfg, settings, placement=placement, digests=digests, uris=uris, frames=frames,
                              sampler_state=lambda step: sampler_state(cfg, domains, frames, stream, step),
                              stream=stream, rewards=rewards,
                              base_model=cfg.base_model, rollouts=rollouts)
    trainer.add_callback(callback)
    trainer.remove_callback(PrinterCallback)  # raw metric dicts; the callback prints one readable line instead
    out = Path(cfg.output_dir)
    weights = 4 * sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # fp32 (ZeRO-3: full size)
    complete = ckpt.local_checkpoints(out)
    # a checkpoint is about the last one's size; before any, weights + Adam's two moments + fp32 master copy
    checkpoint_bytes = folder_bytes(out / f"checkpoint-{complete[-1]}") if complete else 4 * weights
    with disk_full_is_named(out, "a checkpoint", checkpoint_bytes):
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)

    result: dict[str, Any] = {"steps": trainer.state.global_step}
    if cfg.export:
        export_dir = out / "model"
        with disk_full_is_named(out, "the exported model", weights):
            trainer.save_model(str(export_dir))  # ZeRO-3: gathers the partitions, rank 0 writes safetensors
        if state.is_main_process:
            tokenizer.save_pretrained(export_dir)
            result["model_dir"] = str(export_dir)
    callback.finish(result)
    state.wait_for_everyone()
    return result
