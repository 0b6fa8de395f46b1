"""One settings model for the whole platform (env prefix ``TEMPER_``).

The embedded default needs no configuration at all: MLflow in a sqlite file and the
store under ``./.temper``, Prefect's ephemeral API, local processes for every workload.
The embedded MLflow store is one sqlite file plus one artifact root: `temper demo` writes them
directly and `temper up` serves the same two, so whichever command ran first, the other sees it.
Every other module reads its connection details from here and nowhere else.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TEMPER_", extra="ignore")

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
    backend: Literal["local", "kubernetes"] = Field(
        default="local",
        description="Where workloads run: local processes or Kubernetes pods/jobs. The default of "
        "post_training's `backend` parameter, resolved when a flow run starts.",
    )
    sandbox_backend: Literal["bwrap", "kubernetes"] = Field(
        default="bwrap",
        description="Where this process's verifiers run untrusted programs: bubblewrap boxes here, or sandbox "
        "pods (infra.sandbox.kubernetes). The flow's execution backend sets it for the jobs it starts.",
    )
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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Process-wide settings; tests call ``get_settings.cache_clear()`` after changing env."""
    return Settings()
