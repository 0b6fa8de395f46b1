"""When to retrain: the datasets the latest version was trained on vs the datasets in the store now.

Each version's lifecycle run recorded every training dataset with its sha256 (MLflow dataset
inputs, digest = sha256[:32]). The comparison is with the *latest* version of the model, whatever
its alias: a candidate that failed the gate was trained on that data too, and training it again
on the same data would only register the same failure every night. Retraining is due when a
domain's digest differs from that version's, when a domain is new, or when there is no version.
"""

from __future__ import annotations

from typing import Any

from infra.tracking.runs import MLFLOW_DIGEST_LEN
from temper.core.errors import TrackingError
from temper.core.tag_names import CONTEXT_TRAINING, DATA_CONTEXT
from temper.registry.samples import lifecycle_run_id


def latest_version(model_name: str) -> Any | None:
    """The model's highest-numbered version (any alias, or none); None when nothing is registered."""
    # lazy: mlflow (1.6 s) would load whenever flows.retrain is imported
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        versions = MlflowClient().search_model_versions(f"name = '{model_name}'")
    except MlflowException as e:
        raise TrackingError(f"cannot list versions of {model_name}: {e.message.splitlines()[0]}") from None
    return max(versions, key=lambda mv: int(mv.version), default=None)


def trained_digests(mv: Any) -> dict[str, str]:
    """domain -> dataset digest the version was trained on ({} when its lifecycle run is unknown)."""
    # lazy: mlflow (1.6 s) would load whenever flows.retrain is imported
    from mlflow.tracking import MlflowClient

    run_id = lifecycle_run_id(mv)
    if run_id is None:
        return {}
    run = MlflowClient().get_run(run_id)
    return {d.dataset.name: d.dataset.digest for d in run.inputs.dataset_inputs
            if any(t.key == DATA_CONTEXT and t.value == CONTEXT_TRAINING for t in d.tags)}


def latest_trained(model_name: str) -> tuple[str | None, dict[str, str] | None]:
    """(version, its training digests) of the latest version; (None, None) when there is none."""
    mv = latest_version(model_name)
    return (None, None) if mv is None else (str(mv.version), trained_digests(mv))


def changed_domains(trained: dict[str, str] | None, current: dict[str, str | None]) -> list[str]:
    """Domains whose data is new or different since ``trained`` (all of them when there is no version)."""
    if trained is None:
        return sorted(current)
    return sorted(d for d, digest in current.items()
                  if digest is None or trained.get(d) != digest[:MLFLOW_DIGEST_LEN])
