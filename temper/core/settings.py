"""One settings model for the whole platform (env prefix ``TEMPER_``).

The embedded default needs no configuration at all: MLflow in a sqlite file and the
store under ``./.temper``, Prefect's ephemeral API, local processes for every workload.
The embedded MLflow store is one sqlite file plus one artifact root: `temper demo` writes them
directly and `temper up` serves the same two, so whichever command ran first, the other sees it.
Every other module reads its connection details from here and nowhere else.

Two sections are models of their own: ``rollout`` (where rollouts are generated; ``TEMPER_ROLLOUT_<FIELD>``)
and ``job`` (what a flow tells each job it starts: its parent run, its shard). A section also loads from
one variable holding its JSON (``TEMPER_ROLLOUT``, ``TEMPER_JOB``): that is how a flow hands a section to
the jobs it starts (``section_env``), and a job's ``TEMPER_<SECTION>_<FIELD>`` variables win over it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Backend = Literal["local", "kubernetes"]  # where a flow run's jobs run (temper.lifecycle.execution)


class RolloutSettings(BaseModel):
    """Where rollouts are generated: ``Settings.rollout`` (``TEMPER_ROLLOUT_<FIELD>``), or a YAML ``rollout:`` section.

    Whether the settings can start a client is checked when one is made (``checked``), not when settings
    load: a process that never generates must not fail on a half-set rollout section.
    """

    model_config = ConfigDict(extra="ignore")

    backend: Literal["embedded", "vllm"] | None = Field(
        default=None,
        description="'embedded': the transformers engine in this repo; 'vllm': a vLLM server. Unset: eval jobs "
                    "generate with transformers in their own process (`workloads.evaluate --generator local`), and "
                    "a rollout client made anyway serves as 'embedded'.")
    base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible base URL ending in /v1. Required for vllm; for embedded, None starts the "
                    "engine in-process on 127.0.0.1 and points the client at it.")
    model: str = Field(default="temper", description="Served model name (vLLM: --served-model-name).")
    api_key: str = Field(default="EMPTY", description="Bearer token; vLLM --api-key, ignored by the embedded server.")
    model_dir: Path | None = Field(default=None, description="Embedded backend: model folder to load.")
    profile: Literal["standard", "fast"] = Field(
        default="standard", description="Embedded backend: 'fast' = speculative decoding (prompt lookup, or "
                                        "the draft model in draft_dir).")
    draft_dir: Path | None = Field(default=None, description="Embedded fast profile: a draft model folder (None: prompt "
                                   "lookup).")
    timeout_s: float = Field(default=600.0, gt=0, description="Per-request HTTP timeout.")
    max_retries: int = Field(default=4, ge=0, description="openai client retries (429s back off and retry).")
    concurrency: int = Field(default=8, ge=1, description="Requests the client keeps in flight.")

    def checked(self) -> RolloutSettings:
        """These settings, or a ValueError saying what a client built from them would lack."""
        if self.backend == "vllm" and not self.base_url:
            raise ValueError("backend 'vllm' needs base_url (e.g. http://vllm.temper.svc:8000/v1)")
        if self.backend != "vllm" and not self.base_url and self.model_dir is None:
            raise ValueError("backend 'embedded' needs model_dir (or base_url of a running `temper serve`)")
        return self

    @classmethod
    def from_yaml(cls, path: str | Path) -> RolloutSettings:
        """Read the ``rollout:`` section of a YAML file (values come from the file alone, not the environment)."""
        # lazy: yaml (11 ms) would load with every settings import
        import yaml

        raw = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(raw.get("rollout", raw))


class JobSettings(BaseModel):
    """What a flow tells each job it starts (a local process or a pod): set by ``temper.lifecycle.execution`` and the
    launchers as ``TEMPER_JOB`` (``with_job``); a job started by hand has the defaults."""

    model_config = ConfigDict(extra="forbid")

    parent_run_id: str | None = Field(
        default=None, description="The MLflow run a training job's stage run nests under (the lifecycle run).")
    shard_index: int = Field(default=0, ge=0, description="Eval jobs: this shard's index, in [0, num_shards).")
    num_shards: int = Field(default=1, ge=1, description="Eval jobs: how many shards split the domains.")
    sandbox_owner: str | None = Field(
        default=None, description="Kubernetes jobs: the job's name, which its sandbox pods carry as their owner "
                                  "label, so the launcher deletes the boxes a job left behind.")


class Settings(BaseSettings):
    # TEMPER_ROLLOUT_BASE_URL -> rollout.base_url: split once after the section name, so field names keep their "_"
    model_config = SettingsConfigDict(env_prefix="TEMPER_", env_nested_delimiter="_", env_nested_max_split=1,
                                      extra="ignore")

    home: Path = Field(
        default=Path(".temper"),
        description="Working directory for embedded state (sqlite tracking DB, local store, caches).",
    )
    tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI. None means sqlite:///<home>/mlflow.db (embedded; `temper up` serves it).",
    )
    storage_root: str | None = Field(
        default=None,
        description="Root of the artifact/data store: a local path or s3://bucket/prefix. "
        "None means <home>/store.",
    )
    s3_endpoint_url: str | None = Field(
        default=None,
        description="S3 endpoint for s3:// storage (MinIO, moto, a cloud region endpoint). "
        "None means the AWS default resolution.",
    )
    s3_credentials: Literal["env", "profile", "anonymous"] = Field(
        default="env",
        description="Where s3fs gets credentials: the standard AWS env vars/instance role ('env'), "
        "a named profile from s3_profile ('profile'), or none ('anonymous').",
    )
    s3_profile: str | None = Field(default=None, description="AWS profile name when s3_credentials='profile'.")
    store_retry_s: float = Field(
        default=300, ge=0,
        description="How long a checkpoint upload keeps retrying through a store outage before the job fails (s).",
    )
    tracking_retry_s: float = Field(
        default=240, ge=0, le=1080,
        description="How long every MLflow call (the flow's, a training job's) keeps retrying through a tracking "
        "server outage before the stage fails with one line naming the server (s). At most 1080: MLflow's "
        "client makes at most 10 retries, each at most 120 s after the last.",
    )
    prefect_api_url: str | None = Field(
        default=None,
        description="Prefect API URL. None means Prefect's ephemeral in-process API.",
    )
    backend: Backend = Field(
        default="local",
        description="Where workloads run: local processes or Kubernetes pods/jobs. The default of "
        "post_training's `backend` parameter, resolved when a flow run starts.",
    )
    sandbox_backend: Literal["bwrap", "kubernetes"] = Field(
        default="bwrap",
        description="Where this process's verifiers run untrusted programs: bubblewrap boxes here, or sandbox "
        "pods (infra.sandbox.kubernetes). The flow's execution backend sets it for the jobs it starts.",
    )
    rollout: RolloutSettings = Field(
        default_factory=RolloutSettings,
        description="Where rollouts are generated (TEMPER_ROLLOUT_<FIELD>, e.g. TEMPER_ROLLOUT_BACKEND). The flow "
        "hands it to the eval jobs it starts.")
    job: JobSettings = Field(
        default_factory=JobSettings,
        description="This process's place in a flow run, when a flow started it as a job (TEMPER_JOB).")
    preimported_jobs: bool = Field(
        default=True,
        description="Local jobs (training ranks, their launcher, eval jobs) start as forks of a process that has "
        "imported torch, transformers, TRL, DeepSpeed and MLflow once (infra/job_zygote.py), not as fresh "
        "interpreters (~10 s of imports each). CPU hosts only; a GPU host always starts fresh processes.")
    catalog_dir: Path = Field(
        default=Path("domains"),
        description="Directory of domain YAML files (globbed: <catalog_dir>/**/*.yaml).",
    )
    contracts_dir: Path | None = Field(
        default=None,
        description="Directory of data-contract YAML files. None means the shipped data_contracts/ package.",
    )

    @property
    def resolved_tracking_uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        return f"sqlite:///{(self.home / 'mlflow.db').resolve()}"

    @property
    def resolved_artifact_root(self) -> Path:
        """Where the embedded store keeps artifacts: one folder per experiment, for writers and the server alike."""
        return (self.home / "artifacts").resolve()

    @property
    def resolved_storage_root(self) -> str:
        if self.storage_root:
            return self.storage_root.rstrip("/")
        return str((self.home / "store").resolve())

    @property
    def resolved_contracts_dir(self) -> Path:
        if self.contracts_dir:
            return self.contracts_dir
        # Located, not imported: the settings leaf must not import another room.
        return Path(importlib.util.find_spec("data_contracts").origin).resolve().parent


def section_env(section: str, value: BaseModel, exclude: set[str] | None = None) -> dict[str, str]:
    """A settings section as the one variable a job's ``Settings`` reads it back from (``TEMPER_<SECTION>``, JSON)."""
    return {f"TEMPER_{section.upper()}": value.model_dump_json(exclude=exclude, exclude_none=True)}


def with_job(env: Mapping[str, str], **fields: Any) -> dict[str, str]:
    """``env`` with its job section updated by ``fields`` (parent run, shard, sandbox owner): the flow and the
    launchers each add what they know; the job reads the whole as ``get_settings().job``."""
    raw = env.get("TEMPER_JOB")
    job = JobSettings.model_validate_json(raw) if raw else JobSettings()
    return {**env, **section_env("job", JobSettings.model_validate({**job.model_dump(), **fields}))}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Process-wide settings; tests call ``get_settings.cache_clear()`` after changing env."""
    return Settings()
