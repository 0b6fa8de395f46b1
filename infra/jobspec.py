"""The job spec every launcher runs: local processes or Kubernetes pods, same fields.

A job is a command in an image, run by ``world_size`` cooperating processes (ranks). The
local launcher starts them with ``accelerate launch``; the Kubernetes launcher turns the
same spec into an Indexed Job with a headless Service for rendezvous.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NAME_MAX = 52  # room for what Kubernetes derives from a Job's name (its pods' names and labels): 63 at most
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def job_name(stage: str, run: str, max_len: int = NAME_MAX) -> str:
    """The job of ``stage`` of ``run``: the same name for the same two, so a retried task or `temper resume`
    finds by name alone the Job (or the local process group, by its claim file) an earlier attempt started.

    ``<stage>-<run>`` as it is when that is already a DNS-1123 label of at most ``max_len`` characters
    (``grpo-pt-1a2b3c4d-grpo``). Otherwise its slug (lowercase, other characters as '-') cut to leave
    room for a hash of the whole of it: the stage stays readable at the front, and two runs that differ
    only past the cut or in a replaced character still get different names.
    """
    if max_len < 16:
        raise ValueError(f"max_len {max_len}: a name needs room for its stage and a 10-character hash")
    text = f"{stage}-{run}"
    slug = _NOT_DNS.sub("-", text.lower()).strip("-")
    if slug == text and len(slug) <= max_len:
        return slug
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return "-".join(filter(None, [slug[: max_len - len(digest) - 1].rstrip("-"), digest]))


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu: str = Field(default="2", description="CPU request/limit per node (Kubernetes quantity).")
    memory: str = Field(default="8Gi", description="Memory request/limit per node (Kubernetes quantity).")
    gpus: int = Field(default=0, ge=0, description="GPUs per node (nvidia.com/gpu).")
    shm_size: str = Field(default="2Gi", description="Size of the memory-backed /dev/shm per node.")


class JobSpec(BaseModel):
    """One workload run. ``name`` must be deterministic (``job_name`` of stage + run) so a retry adopts it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=NAME_MAX,
                      description="DNS-1123 label (job_name); becomes the Job/Service name on Kubernetes.")
    kind: Literal["train", "eval", "sandbox"] = Field(description="What the job is; selects defaults and policies.")
    image: str = Field(default="temper-workload:latest", description="Container image (Kubernetes only).")
    command: list[str] = Field(description="Program and arguments run on every rank, e.g. ['python', '-m', 'workloads.train', ...].")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for every rank.")
    nodes: int = Field(default=1, ge=1, description="Machines (pods). Locally always 1.")
    procs_per_node: int = Field(default=1, ge=1, description="Processes per machine (one per GPU, or CPU ranks).")
    distributed: bool = Field(default=False, description="Start through `accelerate launch` with rendezvous.")
    accelerate_config: str | None = Field(default=None, description="Path of the accelerate config file for distributed jobs.")
    resources: Resources = Field(default_factory=Resources)
    timeout_s: float = Field(default=3600, gt=0, description="Wall-clock limit; the whole job is killed after it.")
    retries: int = Field(default=0, ge=0, description="Backoff limit on Kubernetes (a retry resumes from checkpoint).")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node
