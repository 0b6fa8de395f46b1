"""Render config (YAML people edit) -> the manifests a run submits, as YAML documents."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from infra.jobspec import JobSpec
from infra.k8s import manifests as m
from infra.k8s.errors import KubernetesError
from infra.k8s.options import KubernetesOptions, load_yaml_model


class RenderConfig(BaseModel):
    """One run on one cluster: the same JobSpec the local launcher takes, plus cluster knobs."""

    model_config = ConfigDict(extra="forbid")

    job: JobSpec = Field(description="The workload (infra.jobspec.JobSpec).")
    kubernetes: KubernetesOptions = Field(default_factory=KubernetesOptions, description="Cluster placement.")
    shards: int = Field(default=1, ge=1, description="Eval only: one Job per shard.")
    attempt: int = Field(default=0, ge=0, description="Which retry attempt to render (0 = first; names get -r<k>).")


def load_render_config(path: Path) -> RenderConfig:
    return load_yaml_model(path, RenderConfig, "render config")


def render(cfg: RenderConfig) -> list[dict]:
    objs = m.objects_for(cfg.job, cfg.kubernetes, shards=cfg.shards, attempt=cfg.attempt)
    return [m.to_dict(o) for o in objs]


_RENDERED = re.compile(r"^\d{2}-[a-z]+-[a-z0-9.-]+\.yaml$")  # the names write_manifests gives


def write_manifests(docs: list[dict], out_dir: Path) -> list[Path]:
    """One file per object, numbered in creation order (kubectl apply -f DIR keeps that order).

    Manifests an earlier render left in ``out_dir`` are removed first: `kubectl apply -f DIR`
    would otherwise submit the stale objects next to the new ones. Other files are left alone.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise KubernetesError(f"--out {out_dir}: exists and is not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.iterdir():
            if old.is_file() and _RENDERED.match(old.name):
                old.unlink()
    except OSError as e:
        raise KubernetesError(f"--out {out_dir}: cannot write manifests there: {e.strerror}") from None
    paths = []
    for i, doc in enumerate(docs):
        p = out_dir / f"{i:02d}-{doc['kind'].lower()}-{doc['metadata']['name']}.yaml"
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(p)
    return paths
