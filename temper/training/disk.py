"""A full disk during a checkpoint or the export: one line naming the folder and the bytes.

DeepSpeed writes checkpoints through ``torch.save``, which reports a full disk as a RuntimeError
("PytorchStreamWriter failed writing file ...: file write failed") rather than as ENOSPC, and
safetensors has its own error type. So a failed write is judged by the disk it wrote to: an
ENOSPC anywhere in the exception chain, or a failed write with less free space left than the write
needed, makes it "disk full" with those two numbers. A checkpoint that did not finish has no ``temper_state.json``,
so a restart never resumes from it: the newest complete checkpoint stays the one it uses. The
half-written folder is removed here so that it does not hold the space a retry needs.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from temper.training.checkpoint import STATE_FILE, local_checkpoints
from temper.training.config import TrainingError


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


#: Functions a checkpoint or export write passes through (HF Trainer, DeepSpeed, torch, safetensors).
SAVING = {"_save_checkpoint", "save_checkpoint", "save_model", "save_pretrained", "save", "save_file"}


def _during_save(error: BaseException) -> bool:
    for e in _chain(error):
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_name in SAVING:
                return True
            tb = tb.tb_next
    return False


def disk_full(error: BaseException, free: int, needed: int) -> bool:
    """ENOSPC anywhere in the chain, or a write that failed (torch reports a short write as "unexpected
    pos ...", not ENOSPC) while less space is free than it needed."""
    for e in _chain(error):
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left on device" in str(e):
            return True
    return free < needed and _during_save(error)


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def remove_incomplete_checkpoints(output_dir: Path) -> list[str]:
    """Delete ``checkpoint-*`` folders without a state file (writes that did not finish)."""
    removed = []
    for folder in sorted(output_dir.glob("checkpoint-*")):
        if folder.is_dir() and not (folder / STATE_FILE).exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


@contextmanager
def disk_full_is_named(folder: Path, what: str, needed_bytes: int) -> Iterator[None]:
    """Re-raise a write failure caused by a full disk under ``folder`` as one TrainingError line."""
    try:
        yield
    except TrainingError:
        raise
    except Exception as e:
        free = _free_bytes(folder)
        if not disk_full(e, free, needed_bytes):
            raise
        removed = remove_incomplete_checkpoints(folder)
        kept = [f"checkpoint-{step}" for step in local_checkpoints(folder)]
        raise TrainingError(
            f"disk full: {what} could not be written to {folder}: {_size(free)} free there, about "
            f"{_size(needed_bytes)} needed; " + (f"removed the incomplete {', '.join(removed)}; " if removed else "")
            + (f"{kept[-1]} is complete and a restart resumes from it" if kept else "no complete checkpoint yet")
        ) from e
