"""What a person sees of a training run: one line per logging step, and quiet libraries.

The ranks print their own lines with the ``temper:`` prefix (progress, checkpoints, resume,
the result); everything else on their stdout is library output. ``is_progress`` is how the
CLI and the flow's training task tell the two apart: they show the first and keep the rest
in the job's log (the CLI's ``--verbose`` and the Prefect task's DEBUG level show it all).

Library noise is silenced at its source where that is cheap: FutureWarnings about torch
and transformers internals (487 of the 1,036 lines of a 10-step SFT run), dataset-map and
shard-writing progress bars, DeepSpeed's accelerator auto-detection warning.
"""

from __future__ import annotations

import logging
import os
import warnings

PREFIX = "temper:"


def is_progress(line: str) -> bool:
    """Lines worth showing a person: temper's own (progress, checkpoints, result) and the launcher's."""
    return line.startswith((PREFIX, "launcher:"))


def quiet_env() -> dict[str, str]:
    """Environment for the ranks: libraries keep their progress bars and deprecation notices to themselves."""
    return {
        "PYTHONWARNINGS": "ignore::FutureWarning",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }


def quiet_libraries() -> None:
    """In a rank: the same as ``quiet_env`` for what reads settings at run time, plus temper's log format."""
    for key, value in quiet_env().items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator is found")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    temper_log = logging.getLogger("temper")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(PREFIX + " %(message)s"))
    temper_log.addHandler(handler)
    temper_log.propagate = False


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def progress_line(mode: str, step: int, total: int, logs: dict, elapsed_s: float, steps_done: int) -> str:
    """``temper: grpo step 12/40 | loss 0.0213 | reward 0.41 | 1.9k tok/s | ETA 1:05``.

    ``steps_done`` and ``elapsed_s`` count from this process's start (a resumed run starts
    late), so the ETA is the remaining steps at the pace seen so far.
    """
    parts = [f"{PREFIX} {mode} step {step}/{total}"]
    if "loss" in logs:
        parts.append(f"loss {logs['loss']:.4g}")
    if "reward" in logs:
        parts.append(f"reward {logs['reward']:.3g}")
    if logs.get("tokens_per_s"):
        rate = logs["tokens_per_s"]
        parts.append(f"{rate / 1000:.1f}k tok/s" if rate >= 1000 else f"{rate:.0f} tok/s")
    if "mfu" in logs:
        parts.append(f"MFU {100 * logs['mfu']:.1f}%")
    if steps_done > 0 and step < total:
        parts.append(f"ETA {format_duration(elapsed_s / steps_done * (total - step))}")
    return " | ".join(parts)


def result_lines(mode: str, result: dict) -> list[str]:
    """The end of a run: where its results are."""
    lines = [f"{PREFIX} {mode} finished after {result['steps']} steps"]
    if result.get("model_dir"):
        lines.append(f"{PREFIX} model folder {result['model_dir']}")
    if result.get("mlflow_run_id"):
        lines.append(f"{PREFIX} MLflow run {result['mlflow_run_id']} (experiment {result['mlflow_experiment']}, "
                     f"tracking {result['tracking_uri']})")
    if result.get("model_version"):
        lines.append(f"{PREFIX} registered model version {result['model_version']}")
    return lines
