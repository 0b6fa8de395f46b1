"""Where the rollout engine's tensors live, and how much of that device its prefix cache may take."""

from __future__ import annotations

import torch

MIB = 1024 * 1024
CPU_PREFIX_BUDGET = 256 * MIB
GPU_PREFIX_SHARE = 0.25  # of the device memory free once the weights are loaded


def engine_device(setting: str) -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU; otherwise the named device, which must exist."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"engine device {setting!r}: no CUDA device is visible to this process")
    return device


def prefix_budget(budget_bytes: int | None, device: torch.device) -> int:
    """The prefix cache's byte budget: the configured one, else 256 MiB on CPU and, on a GPU, a quarter of what is
    free on the device now (the rest is left to running requests' KV and, in a GRPO rank, to training)."""
    if budget_bytes is not None:
        return budget_bytes
    if device.type != "cuda":
        return CPU_PREFIX_BUDGET
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * GPU_PREFIX_SHARE)
