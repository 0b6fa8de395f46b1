"""Model registry operations over MLflow: the champion's eval metrics, registering a version, aliases.

Eval results live on the model version as tags (``temper.eval.<domain>.mean_reward`` ...),
so comparing a candidate with the champion needs no search over runs.
"""

from __future__ import annotations

import json
from typing import Any

from temper.errors import TrackingError
from temper.gate import GateDecision

EVAL_TAG = "temper.eval.{domain}.{metric}"
METRICS = ("mean_reward", "pass_rate", "n")


def _client():
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def champion_metrics(model_name: str, alias: str = "champion") -> tuple[str | None, dict[str, float] | None]:
    """(version, domain -> mean reward) of the alias holder; (None, None) when there is none yet."""
    from mlflow.exceptions import MlflowException

    client = _client()
    try:
        mv = client.get_model_version_by_alias(model_name, alias)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None, None
        raise TrackingError(f"cannot read {model_name}@{alias}: {e.message}") from None
    out = {}
    for key, value in mv.tags.items():
        parts = key.split(".")
        if len(parts) == 4 and parts[:2] == ["temper", "eval"] and parts[3] == "mean_reward":
            out[parts[2]] = float(value)
    return mv.version, out


def eval_tags(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    tags = {}
    for domain, r in results.items():
        for m in METRICS:
            tags[EVAL_TAG.format(domain=domain, metric=m)] = str(r[m])
    return tags


def register_version(model_name: str, source: str, run_id: str, *, eval_results: dict[str, dict[str, Any]],
                     decision: GateDecision, alias: str, fallback_alias: str, tags: dict[str, str]) -> dict[str, Any]:
    """Create the version, tag it with eval metrics and the gate decision, set the right alias."""
    from mlflow.exceptions import MlflowException

    client = _client()
    try:
        client.create_registered_model(model_name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise TrackingError(f"cannot create registered model {model_name}: {e.message}") from None
    mv = client.create_model_version(
        name=model_name, source=source, run_id=run_id,
        tags={**tags, **eval_tags(eval_results), "temper.gate.passed": str(decision.passed).lower(),
              "temper.gate.reason": decision.reason, "temper.gate.deltas": json.dumps(decision.deltas)})
    chosen = alias if decision.passed else fallback_alias
    client.set_registered_model_alias(model_name, chosen, mv.version)
    if not decision.passed:
        client.set_model_version_tag(model_name, mv.version, "temper.candidate_reason", decision.reason)
    return {"name": model_name, "version": mv.version, "alias": chosen, "source": source}
