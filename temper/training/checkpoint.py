"""Checkpoints: HF Trainer ``checkpoint-<step>`` folders, mirrored to the store, last K kept.

Each folder holds the ZeRO-3 partitions, optimizer and scheduler state, every rank's RNG
state (all written by the Trainer/DeepSpeed) plus ``temper_state.json``: the domain
sampler's state and the sha256 of every dataset the run trains on. A restarted run with the
same name finds its newest checkpoint (local first, then the store), and refuses to resume
over changed data (unless the config allows it) or under a changed training config.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from infra.storage import get_fs, join, retrying
from temper.core.settings import Settings, get_settings
from temper.training.config import TrainConfig, TrainingError

STATE_FILE = "temper_state.json"
_CKPT = re.compile(r"^checkpoint-(\d+)$")


def store_uri(cfg: TrainConfig, settings: Settings | None = None) -> str:
    settings = settings or get_settings()
    return (cfg.store_uri or join(settings.resolved_storage_root, "runs", cfg.run_name)).rstrip("/")


def record_key(cfg: TrainConfig, settings: Settings | None = None) -> str:
    """The key (MLflow tag ``temper.record``) of the run's MLflow run: mode, run name and store folder,
    the identity its checkpoints are found by, so a resumed run anywhere continues the same record."""
    where = hashlib.sha256(store_uri(cfg, settings).encode()).hexdigest()[:12]
    return f"{cfg.mode}-{cfg.run_name}-{where}"


def _steps(names: list[str]) -> list[int]:
    return sorted(int(m.group(1)) for n in names if (m := _CKPT.match(n.rstrip("/").rsplit("/", 1)[-1])))


def _complete(fs, path: str) -> bool:
    return fs.exists(f"{path}/{STATE_FILE}")


def local_checkpoints(output_dir: str | Path) -> list[int]:
    out = Path(output_dir)
    if not out.is_dir():
        return []
    return [s for s in _steps([p.name for p in out.iterdir()]) if (out / f"checkpoint-{s}" / STATE_FILE).exists()]


def store_checkpoints(uri: str, settings: Settings | None = None) -> list[int]:
    fs, path = get_fs(uri + "/checkpoints", settings)
    if not fs.exists(path):
        return []
    steps = _steps([p for p in fs.ls(path, detail=False)])
    return [s for s in steps if _complete(fs, f"{path}/checkpoint-{s}")]


def latest_checkpoint(cfg: TrainConfig, settings: Settings | None = None) -> Path | None:
    """Newest complete checkpoint of the run as a local folder (downloaded from the store if needed)."""
    local = local_checkpoints(cfg.output_dir)
    remote = store_checkpoints(store_uri(cfg, settings), settings)
    best = max(local + remote, default=None)
    if best is None:
        return None
    target = Path(cfg.output_dir) / f"checkpoint-{best}"
    if best not in local:
        fs, path = get_fs(store_uri(cfg, settings) + f"/checkpoints/checkpoint-{best}", settings)
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get(path.rstrip("/") + "/", str(target) + "/", recursive=True)
    return target


def sync_to_store(cfg: TrainConfig, checkpoint_dir: Path, settings: Settings | None = None,
                  commit: bool = True) -> str:
    """Copy one checkpoint folder to the store; with ``commit``, then mark it complete (``commit_to_store``).

    On several machines each node's local main uploads the partitions its ranks wrote, all into
    the same store folder, with ``commit=False``; only after every node has (a barrier) does one
    process commit. Two nodes committing raced: one pruned the old checkpoint the other was
    deleting (FileNotFoundError), and a node's state file could mark the checkpoint complete before
    the other node's partitions were there.
    """
    settings = settings or get_settings()
    uri = store_uri(cfg, settings) + f"/checkpoints/{checkpoint_dir.name}"
    fs, path = get_fs(uri, settings)
    for f in sorted(checkpoint_dir.rglob("*")):
        if f.is_file() and f.name != STATE_FILE:
            rel = f.relative_to(checkpoint_dir).as_posix()
            if not uri.startswith("s3://"):
                fs.makedirs(f"{path}/{rel}".rsplit("/", 1)[0], exist_ok=True)
            retrying(lambda f=f, rel=rel: fs.put_file(str(f), f"{path}/{rel}"), f"upload of {uri}/{rel}",
                     settings.store_retry_s)
    if commit:
        commit_to_store(cfg, checkpoint_dir, settings)
    return uri


def commit_to_store(cfg: TrainConfig, checkpoint_dir: Path, settings: Settings | None = None) -> str:
    """The state file last (a half copy is never 'complete'), then delete store checkpoints beyond
    the newest ``save_total_limit``. One process per run does this, after every upload."""
    settings = settings or get_settings()
    uri = store_uri(cfg, settings) + f"/checkpoints/{checkpoint_dir.name}"
    fs, path = get_fs(uri, settings)
    budget = settings.store_retry_s
    retrying(lambda: fs.put_file(str(checkpoint_dir / STATE_FILE), f"{path}/{STATE_FILE}"),
             f"commit of {uri}", budget)
    steps = retrying(lambda: store_checkpoints(store_uri(cfg, settings), settings), f"listing of {uri}", budget)
    for old in steps[:-cfg.stage.save_total_limit]:
        retrying(lambda old=old: fs.rm(f"{path.rsplit('/', 1)[0]}/checkpoint-{old}", recursive=True),
                 f"pruning of checkpoint-{old}", budget)
    return uri


# Fields that may change between a run and its resume: they do not change what is trained.
RESUMABLE_CHANGES = {"max_steps", "save_steps", "save_total_limit", "timeout_s", "resume", "allow_dataset_change",
                     "expected_digests", "export", "register_as", "tracking", "log_shards", "mlflow_experiment", "output_dir", "store_uri"}


def training_fingerprint(cfg: TrainConfig) -> str:
    """Hash of the config fields that define the optimisation (lr, batch, model, seed, ...)."""
    fields = cfg.model_dump(mode="json", exclude=RESUMABLE_CHANGES | {"sft", "grpo"})
    fields["stage"] = cfg.stage.model_dump(mode="json", exclude=RESUMABLE_CHANGES)
    if not fields["stage"].get("curriculum", {}).get("enabled", True):
        del fields["stage"]["curriculum"]  # off, its knobs change nothing (and older checkpoints had none)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def write_state(checkpoint_dir: Path, cfg: TrainConfig, sampler_state: dict, digests: dict[str, str],
                step: int) -> None:
    (checkpoint_dir / STATE_FILE).write_text(json.dumps(
        {"step": step, "sampler": sampler_state, "digests": digests, "fingerprint": training_fingerprint(cfg)},
        indent=1, sort_keys=True))


def read_state(checkpoint_dir: Path) -> dict:
    return json.loads((checkpoint_dir / STATE_FILE).read_text())


def check_resume(cfg: TrainConfig, checkpoint_dir: Path, digests: dict[str, str]) -> dict:
    """The saved state, after refusing a resume over different data (unless allowed)."""
    state = read_state(checkpoint_dir)
    if state.get("fingerprint") != training_fingerprint(cfg):
        raise TrainingError(
            f"run {cfg.run_name}: cannot resume from {checkpoint_dir}: the training config changed since that "
            f"checkpoint (only {', '.join(sorted(RESUMABLE_CHANGES))} may change); use a new run_name")
    saved = state["digests"]
    changed = sorted(k for k in set(saved) | set(digests) if saved.get(k) != digests.get(k))
    if changed and not cfg.allow_dataset_change:
        detail = ", ".join(f"{k}: {saved.get(k, 'absent')[:12]} -> {digests.get(k, 'absent')[:12]}" for k in changed)
        raise TrainingError(
            f"run {cfg.run_name}: cannot resume from {checkpoint_dir}: dataset changed since the checkpoint "
            f"({detail}); set allow_dataset_change: true to continue on the new data, or use a new run_name")
    state["dataset_changed"] = bool(changed)
    return state
