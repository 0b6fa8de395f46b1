"""Reading lineage back: a model version or run, walked up to its parent runs and their datasets.

``lineage_tree`` resolves ``MODEL@ALIAS``, ``MODEL/VERSION`` or a run id to the run that produced it,
its parents (``mlflow.parentRunId``) and the datasets each consumed. What ``temper lineage`` prints is
the graph ``temper.registry.lineage_graph`` builds from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from temper.core.errors import TrackingError
from temper.core.tag_names import DATA_CONTEXT, PARENT_TAG, PREFIX


@dataclass
class DatasetRef:
    name: str
    digest: str
    source: str
    context: str | None


@dataclass
class RunNode:
    run_id: str
    name: str
    experiment_id: str
    tags: dict[str, str]
    datasets: list[DatasetRef] = field(default_factory=list)
    parent: "RunNode | None" = None


@dataclass
class LineageTree:
    ref: str
    model_version: dict[str, Any] | None
    run: RunNode


def _run_node(client: Any, run_id: str, depth: int = 0) -> RunNode:
    run = client.get_run(run_id)
    datasets = []
    for di in run.inputs.dataset_inputs if run.inputs else []:
        ctx = next((t.value for t in di.tags if t.key == DATA_CONTEXT), None)
        source = di.dataset.source
        try:
            source = json.loads(source).get("uri", source)
        except (TypeError, ValueError, AttributeError):
            pass
        datasets.append(DatasetRef(name=di.dataset.name, digest=di.dataset.digest, source=source, context=ctx))
    tags = {k: v for k, v in run.data.tags.items() if k.startswith(PREFIX)}
    node = RunNode(run_id=run_id, name=run.info.run_name, experiment_id=run.info.experiment_id, tags=tags,
                   datasets=datasets)
    parent_id = run.data.tags.get(PARENT_TAG)
    if parent_id and depth < 10:
        node.parent = _run_node(client, parent_id, depth + 1)
    return node


def lineage_tree(ref: str) -> LineageTree:
    """Resolve ``MODEL@ALIAS``, ``MODEL/VERSION`` or a run id to its lineage tree."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    mv = None
    try:
        if "@" in ref:
            name, alias = ref.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        elif "/" in ref:
            name, version = ref.rsplit("/", 1)
            mv = client.get_model_version(name, version)
        run_id = mv.run_id if mv else ref
        if not run_id:
            raise TrackingError(f"{ref}: model version has no producing run")
        run = _run_node(client, run_id)
    except MlflowException as e:
        raise TrackingError(f"{ref}: not found in {client.tracking_uri}: {e.message.splitlines()[0]}") from None
    version = None
    if mv:
        version = {"name": mv.name, "version": mv.version, "aliases": list(mv.aliases or []), "source": mv.source,
                   "run_id": mv.run_id}
    return LineageTree(ref=ref, model_version=version, run=run)
