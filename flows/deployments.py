"""The deployments in prefect.yaml as Prefect objects, for `temper up` (serve) and tests.

prefect.yaml stays the one list of deployments: `prefect deploy` reads it for work pools,
and this module reads the same entries (entrypoint, name, schedules, triggers, concurrency
limit, parameters) to serve them from one process, so a served deployment starts on the same
crons and the same events as a deployed one. Work-pool-only entries (kubernetes) are skipped
when serving.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prefect.client.schemas.objects import ConcurrencyLimitConfig
from prefect.events import DeploymentTriggerTypes
from prefect.flows import load_flow_from_entrypoint
from pydantic import TypeAdapter, ValidationError

from temper.core.errors import TemperError, describe_validation_error

REPO = Path(__file__).resolve().parent.parent
PREFECT_YAML = REPO / "prefect.yaml"
_TRIGGERS = TypeAdapter(list[DeploymentTriggerTypes])


@dataclass
class DeploymentEntry:
    name: str
    entrypoint: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    crons: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    work_pool: str | None = None
    triggers: list[Any] = field(default_factory=list)
    concurrency_limit: Any = None


def read_entries(path: Path = PREFECT_YAML) -> list[DeploymentEntry]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TemperError(f"{path}: cannot read deployments: {e}") from None
    entries = []
    for i, d in enumerate(doc.get("deployments") or []):
        missing = [k for k in ("name", "entrypoint") if not d.get(k)]
        if missing:
            raise TemperError(f"{path}: deployments[{i}] lacks {', '.join(missing)}")
        try:
            triggers = _TRIGGERS.validate_python(d.get("triggers") or [])
        except ValidationError as e:
            raise TemperError(describe_validation_error(f"{path}: deployment {d['name']!r} triggers", e)) from None
        entries.append(DeploymentEntry(
            name=d["name"], entrypoint=d["entrypoint"], description=d.get("description", ""), tags=d.get("tags", []),
            crons=[s["cron"] for s in d.get("schedules") or [] if "cron" in s], parameters=d.get("parameters") or {},
            work_pool=(d.get("work_pool") or {}).get("name"), triggers=triggers,
            concurrency_limit=d.get("concurrency_limit")))
    return entries


def load_flow(entrypoint: str):
    file, _, name = entrypoint.partition(":")
    return load_flow_from_entrypoint(f"{REPO / file}:{name}")


def servable(entries: list[DeploymentEntry], skip_pools: tuple[str, ...] = ("temper-k8s",)) -> list[Any]:
    """RunnerDeployments for ``serve``: what a local process can run."""
    out = []
    for e in entries:
        if e.work_pool in skip_pools:
            continue
        limit = e.concurrency_limit
        out.append(load_flow(e.entrypoint).to_deployment(
            name=e.name, description=e.description, tags=e.tags, cron=e.crons or None, parameters=e.parameters,
            triggers=e.triggers or None,
            concurrency_limit=ConcurrencyLimitConfig(**limit) if isinstance(limit, dict) else limit))
    return out
