"""Export: ZeRO-3 partitions -> an HF safetensors folder, logged to MLflow and registered.

Training writes the consolidated model itself at the end (``trainer.save_model`` gathers the
partitions). ``consolidate_checkpoint`` does the same offline from any saved checkpoint, with
DeepSpeed's own zero_to_fp32 logic, so a crashed run's last checkpoint is still a model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from temper.core.tag_names import TAG_FORMAT
from temper.registry.model_store import log_hf_model
from temper.registry.registration import ensure_registered_model
from temper.training.charts import MAX_CURVES
from temper.training.config import TrainingError


def consolidate_checkpoint(checkpoint_dir: str | Path, base_model_dir: str | Path, out_dir: str | Path) -> Path:
    """Merge a ZeRO-3 checkpoint's partitions into ``out_dir`` (config + tokenizer from the base model)."""
    # lazy: deepspeed+torch+transformers (5.7 s) would load in fast unit tests (test_domain_roles.py)
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    if not (checkpoint_dir / "latest").exists():
        raise TrainingError(f"{checkpoint_dir}: not a DeepSpeed checkpoint (no 'latest' file)")
    state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir))
    config = AutoConfig.from_pretrained(base_model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(base_model_dir).save_pretrained(out_dir)
    return out_dir


def reward_curve_png(metrics_jsonl: str | Path, out_png: str | Path) -> Path | None:
    """Plot reward (and per-domain reward) against step; None when the run logged no reward."""
    path = Path(metrics_jsonl)
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keys = sorted({k for r in rows for k in r if k == "reward" or k.startswith("reward/")})
    if not keys:
        return None
    if len(keys) - ("reward" in keys) > MAX_CURVES:  # hundreds of lines read as none: see charts.domain_heatmap_png
        keys = ["reward"] if "reward" in keys else keys[:MAX_CURVES]
    # lazy: matplotlib (600 ms) would load in fast unit tests (test_domain_roles.py)
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib (600 ms) would load in fast unit tests (test_domain_roles.py)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k in keys:
        pts = [(r["step"], r[k]) for r in rows if k in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=k)
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)


def log_and_register(model_dir: str | Path, name: str) -> str:
    """Log the HF folder as a `transformers` logged model of the active MLflow run and register a version.

    Returns the new version number. Call on rank 0 only, inside an active run.
    """
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow
    from mlflow.tracking import MlflowClient

    run = mlflow.active_run()
    if run is None:
        raise TrainingError(f"cannot register {model_dir} as {name}: no active MLflow run")
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise TrainingError(f"{model_dir}: not an HF model folder (no config.json)")
    logged = log_hf_model(model_dir, description=f"{name}, trained by `temper train` (run {run.info.run_id})")
    client = MlflowClient()
    ensure_registered_model(client, name)
    mv = client.create_model_version(name=name, source=logged.model_uri, run_id=run.info.run_id,
                                     model_id=logged.model_id, tags={TAG_FORMAT: "mlflow-transformers"})
    return str(mv.version)


def copy_model(src: str | Path, dst: str | Path) -> Path:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return Path(dst)
