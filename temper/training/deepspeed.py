"""DeepSpeed JSON and accelerate config, generated from a TrainConfig and the rank's placement (never hand-written).

Choices that matter on CPU: ZeRO-3 with ``stage3_param_persistence_threshold: 0`` (else a
tiny model is not sharded at all), fp32 (bf16 was slower here). On GPUs: the ``bf16`` block when
the placement's precision is bf16 (fp32 master weights and optimizer state, bf16 compute),
communication overlapped with compute, and DeepSpeed's own persistence threshold (small
parameters such as norms stay whole on every rank instead of being gathered at every forward).
Everywhere: no ``optimizer`` block, so the HF Trainer passes torch AdamW (DeepSpeed's fused Adam
JIT-compiles for ~5 min on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from temper.training.config import TrainConfig
from temper.training.device import Placement, rank_placement, visible_gpus
from temper.training.progress import quiet_env

log = logging.getLogger(__name__)  # under "temper": the rank's log lines (progress.py)


def deepspeed_config(cfg: TrainConfig, placement: Placement | None = None) -> dict[str, Any]:
    placement = placement or rank_placement(cfg.precision)
    return {
        "train_micro_batch_size_per_gpu": cfg.stage.per_device_batch_size,
        "train_batch_size": cfg.stage.per_device_batch_size * cfg.world_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": placement.bf16},
        "fp16": {"enabled": False},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": "auto" if placement.cuda else 0,
            "overlap_comm": placement.cuda,
            "contiguous_gradients": True,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def accelerate_config(cfg: TrainConfig, ds_json_path: str) -> dict[str, Any]:
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": ds_json_path, "zero3_init_flag": True},
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": cfg.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
    }


def write_launch_configs(cfg: TrainConfig, directory: str | Path,
                         placement: Placement | None = None) -> tuple[Path, Path]:
    """Write ds_config.json and accelerate.yaml into ``directory``; returns both paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ds_path = directory / "ds_config.json"
    ds_path.write_text(json.dumps(deepspeed_config(cfg, placement), indent=2))
    acc_path = directory / "accelerate.yaml"
    acc_path.write_text(yaml.safe_dump(accelerate_config(cfg, str(ds_path.resolve()))))
    return ds_path, acc_path


def torch_extensions_dir() -> str:
    """Persistent JIT cache: moving it forces DeepSpeed to recompile its comm op (~1 min). One per environment
    (``sys.prefix``): a build's commands name that environment's torch headers, so two checkouts' venvs sharing
    one folder would recompile the op at every switch between them."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    env = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return str(Path.home() / ".cache" / "temper" / "torch_extensions" / env)


PREBUILT_EXTENSIONS_ENV = "TEMPER_PREBUILT_TORCH_EXTENSIONS"  # set by the workload image (docker/Dockerfile)


def seed_torch_extensions() -> list[str]:
    """Copy the ops the image compiled when it was built (the folder ``TEMPER_PREBUILT_TORCH_EXTENSIONS`` names)
    into this process's JIT cache where the cache lacks them; returns the ops copied.

    Why: a pod's cache is its own /tmp (the root filesystem is read-only, and torch's loader writes a lock and
    build.ninja beside an op even when it builds nothing), so every CPU rank pod compiled DeepSpeed's comm op at
    its start (1-3 min on 2 cores). Copied with their times, ninja finds them up to date: the image's sources,
    compiler and ninja are the ones that built them. Each op is copied whole to a temporary folder, then renamed
    into place: two ranks of one pod never load half a copy."""
    prebuilt = os.environ.get(PREBUILT_EXTENSIONS_ENV)
    if not prebuilt or not Path(prebuilt).is_dir():
        return []
    cache, copied = Path(torch_extensions_dir()), []
    for op in sorted(p for p in Path(prebuilt).iterdir() if p.is_dir()):
        if (cache / op.name).exists():
            continue
        tmp = None
        try:
            cache.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{op.name}-", dir=cache))
            shutil.copytree(op, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("lock", ".ninja_lock"))
        except OSError as err:  # a full or unwritable /tmp: the copy only saves time, DeepSpeed compiles it instead
            log.warning("could not copy the image's %s op into %s (%s): DeepSpeed compiles it", op.name, cache, err)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            continue
        try:
            tmp.rename(cache / op.name)
            copied.append(op.name)
        except OSError:  # another rank of this pod put it there first
            shutil.rmtree(tmp, ignore_errors=True)
    return copied


def accelerator_env() -> dict[str, str]:
    """The accelerator DeepSpeed uses, named for every local job, training and eval alike: DeepSpeed then does not
    probe and warn, and both kinds of job have one import environment, so one job zygote serves them all
    (``infra/job_zygote.py`` keys its zygotes by that environment; eval jobs without it started a second zygote,
    ~9 s of CPU)."""
    return {"DS_ACCELERATOR": "cuda" if visible_gpus() else "cpu"}


def launch_env(ranks: int) -> dict[str, str]:
    """Environment the launcher gives every local rank, libraries quiet: on a machine without GPUs the cores shared
    out among the ``ranks`` (2 ranks on 2 cores: one OpenMP thread each; one rank: both, or a single-process run of a
    real model would leave a core idle); on a GPU machine each rank sets its own threads (``configure_rank``)."""
    gpus = visible_gpus()
    threads = max(1, len(os.sched_getaffinity(0)) // max(1, ranks))  # the cores this process may use, not the host's
    return {
        **quiet_env(),
        **accelerator_env(),  # also the launcher's
        **({} if gpus else {"OMP_NUM_THREADS": str(threads)}),
        "TORCH_EXTENSIONS_DIR": torch_extensions_dir(),
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
