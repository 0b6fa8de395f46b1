"""Where a training rank runs, decided in one place from what the rank sees.

A rank that sees a CUDA device trains on ``cuda:LOCAL_RANK`` with NCCL, DeepSpeed's CUDA
accelerator, bf16 where the GPU has it (``precision: auto``) and a share of the machine's cores
for its data and tokenizer work. A rank that sees none keeps the CPU path temper was built on:
gloo, DeepSpeed's CPU accelerator, fp32 (bf16 was slower on the CPUs measured) and one intra-op
thread per rank (2 ranks on 2 cores). Nothing else in temper asks which device it is on: the
trainer, the DeepSpeed config and the launcher read a ``Placement``.

``world_size: auto`` is one rank per visible GPU, or ``CPU_WORLD_SIZE`` processes on a machine
with none. Which GPUs are visible is asked without importing torch where no NVIDIA device node
exists (a CPU machine's every config load would otherwise pay torch's ~2 s import).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from temper.core.errors import TrainingError

Precision = Literal["auto", "fp32", "bf16"]

CPU_WORLD_SIZE = 2  # ranks on a machine without GPUs: the 2-core machines temper was built on

# Dense bf16 tensor-core peak (FLOP/s, no sparsity) by product name, for MFU. Vendor datasheets:
# H100/H200 SXM 989.4 TFLOP/s, A100 312 TFLOP/s, L40S 362 TFLOP/s. A GPU not listed gets no MFU.
PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12}

_NVIDIA_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/gpus")


def visible_gpus() -> int:
    """CUDA devices this process may use (0 on a machine without NVIDIA devices, or when
    ``CUDA_VISIBLE_DEVICES`` hides them all)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    if not any(Path(p).exists() for p in _NVIDIA_NODES):
        return 0
    # lazy: torch (2 s) only where a GPU may be
    import torch

    return torch.cuda.device_count()


def resolve_world_size(requested: int | str) -> int:
    """``auto``: in a rank of a started job, the job's size (``WORLD_SIZE``, set by the launcher: a Kubernetes job
    of 2 pods x 4 GPUs is 8 whatever one pod sees); elsewhere one rank per visible GPU, else ``CPU_WORLD_SIZE``.
    A number as given."""
    if requested == "auto":
        if os.environ.get("WORLD_SIZE", "").isdigit():
            return int(os.environ["WORLD_SIZE"])
        return visible_gpus() or CPU_WORLD_SIZE
    return int(requested)


def check_world_size(world_size: int, where: str = "world_size") -> None:
    """Before a local job starts: more ranks than visible GPUs would put two ranks' NCCL on one device (or
    crash with 'invalid device ordinal'), so it is refused here, in one line. CPU-only machines take any number."""
    gpus = visible_gpus()
    if gpus and world_size > gpus:
        raise TrainingError(f"{where} is {world_size} but this machine has {gpus} GPU(s) visible: set world_size: auto "
                            f"(one rank per GPU) or at most {gpus}")


@dataclass(frozen=True)
class Placement:
    """What one rank runs on: ``device`` (``cuda:N`` or ``cpu``), the collective ``backend`` and ``precision``."""

    device: str
    backend: str
    precision: Literal["fp32", "bf16"]

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    @property
    def ds_accelerator(self) -> str:
        return "cuda" if self.cuda else "cpu"


def resolve_precision(precision: Precision, cuda: bool) -> Literal["fp32", "bf16"]:
    """``auto``: bf16 on a GPU that computes in it (Ampere and newer), fp32 on CPU."""
    if precision == "fp32":
        return "fp32"
    if not cuda:
        return "bf16" if precision == "bf16" else "fp32"
    # lazy: torch (2 s) only where a GPU may be
    import torch

    supported = torch.cuda.is_bf16_supported()
    if precision == "bf16" and not supported:
        raise TrainingError(f"precision bf16: {torch.cuda.get_device_name()} has no bf16 support; use precision: "
                            "fp32 or auto")
    return "bf16" if supported else "fp32"


def rank_placement(precision: Precision) -> Placement:
    """This rank's placement, from ``LOCAL_RANK`` and the GPUs it sees."""
    gpus = visible_gpus()
    if not gpus:
        return Placement("cpu", "gloo", resolve_precision(precision, cuda=False))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= gpus:
        raise TrainingError(f"rank with LOCAL_RANK {local_rank} sees only {gpus} GPU(s): start at most one rank per "
                            "GPU (world_size: auto)")
    return Placement(f"cuda:{local_rank}", "nccl", resolve_precision(precision, cuda=True))


def configure_rank(placement: Placement) -> None:
    """Set up this process for ``placement`` before DeepSpeed or accelerate look at it: DeepSpeed's accelerator
    (read once, at its first use), the current CUDA device, and intra-op threads (a GPU rank tokenizes, pads and
    scores on the CPU: one core is too few; a CPU rank keeps the launcher's OMP_NUM_THREADS, its share of the
    cores: ``launch_env``)."""
    os.environ["DS_ACCELERATOR"] = placement.ds_accelerator
    use_interpreters_ninja()
    if not placement.cuda:
        return
    # lazy: torch (2 s), only in a rank
    import torch

    torch.cuda.set_device(placement.device)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, min(8, (os.cpu_count() or 1) // max(1, local_ranks))))


def use_interpreters_ninja() -> None:
    """Put this interpreter's scripts folder first on PATH when it holds ``ninja``, as the image's PATH does.

    DeepSpeed JIT-builds its CPU comm op with the ``ninja`` on PATH into TORCH_EXTENSIONS_DIR. Two ninjas on one
    machine (the system's 1.11 and the 1.13 that deepspeed's dependency puts in the venv) each read the other's
    build log as too old or unknown and rebuild the op: ~100 s of CPU every time a rank started from a shell
    without the venv on PATH and a pod (``/opt/venv/bin`` first) took turns on one cache (measured: every stand-in
    cluster run recompiled it)."""
    scripts = Path(sys.executable).parent
    path = os.environ.get("PATH", "")
    if (scripts / "ninja").exists() and not path.startswith(f"{scripts}{os.pathsep}"):
        os.environ["PATH"] = os.pathsep.join([str(scripts), *(p for p in path.split(os.pathsep) if p != str(scripts))])


def peak_flops(placement: Placement) -> float | None:
    """The device's dense bf16 peak in FLOP/s (None on CPU, for fp32 runs and for GPUs not in the table)."""
    if not placement.cuda or not placement.bf16:
        return None
    # lazy: torch (2 s), only in a rank
    import torch

    name = torch.cuda.get_device_name(placement.device)
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in name), None)
