"""When to retrain: the datasets the champion was trained on vs the datasets in the store now.

The champion's lifecycle run recorded every training dataset with its sha256 (MLflow dataset
inputs, digest = sha256[:32]). Retraining is due when a domain's digest differs, when a
domain is new, or when there is no champion at all.
"""

from __future__ import annotations

from infra.lineage import MLFLOW_DIGEST_LEN


def champion_digests(model_name: str, alias: str) -> dict[str, str] | None:
    """domain -> dataset digest the alias holder was trained on; None when the alias is unset."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from temper.registry.samples import lifecycle_run_id

    client = MlflowClient()
    try:
        mv = client.get_model_version_by_alias(model_name, alias)
    except MlflowException:
        return None
    run_id = lifecycle_run_id(mv)
    if run_id is None:
        return {}
    run = client.get_run(run_id)
    return {d.dataset.name: d.dataset.digest for d in run.inputs.dataset_inputs
            if any(t.key == "mlflow.data.context" and t.value == "training" for t in d.tags)}


def changed_domains(trained: dict[str, str] | None, current: dict[str, str | None]) -> list[str]:
    """Domains whose data is new or different since ``trained`` (all of them when there is no champion)."""
    if trained is None:
        return sorted(current)
    return sorted(d for d, digest in current.items()
                  if digest is None or trained.get(d) != digest[:MLFLOW_DIGEST_LEN])
