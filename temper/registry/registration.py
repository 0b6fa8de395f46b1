"""What the post_training flow does with the registry: read the champion, register a version.

Eval results live on the model version as tags (``temper.eval.<domain>.mean_reward`` ...),
so comparing a candidate with the champion needs no search over runs; the gate's significance
test reads the per-sample rewards of both (``samples``).
"""

from __future__ import annotations

import json
from typing import Any

from temper.core.errors import TrackingError
from temper.core.tag_names import (
    TAG_CANDIDATE_REASON,
    TAG_GATE_DELTAS,
    TAG_GATE_PASSED,
    TAG_GATE_REASON,
    TAG_LIFECYCLE_RUN,
)
from temper.registry.aliases import record_flow_alias
from temper.registry.gate import GateDecision
from temper.registry.samples import Samples, eval_curve, eval_samples, version_curves, version_samples
from temper.registry.store import aliases_of, client, mlflow_message, registered_model, version_of
from temper.registry.tags import eval_tags, mean_rewards


def champion(model_name: str, alias: str = "champion") -> Any | None:
    """The alias holder (an MLflow ModelVersion), or None when there is none yet."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    try:
        return client().get_model_version_by_alias(model_name, alias)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise TrackingError(f"cannot read {model_name}@{alias}: {mlflow_message(e)}") from None


def champion_metrics(model_name: str, alias: str = "champion") -> tuple[str | None, dict[str, float] | None]:
    """(version, domain -> mean reward) of the alias holder; (None, None) when there is none yet."""
    mv = champion(model_name, alias)
    return (None, None) if mv is None else (version_of(mv), mean_rewards(mv.tags))


def champion_samples(model_name: str, version: str | None) -> dict[str, Samples]:
    """Per-sample eval rewards of a version (its candidate evals), for the gate; {} without a version."""
    return version_samples(client().get_model_version(model_name, version)) if version else {}


def champion_curves(model_name: str, version: str | None) -> dict[str, list]:
    """(prompt tokens, reward) per sample of a version's long-context domains, for the gate; {} without one."""
    return version_curves(client().get_model_version(model_name, version)) if version else {}


def run_curves(results: list[dict[str, Any]]) -> dict[str, list]:
    """domain -> (prompt tokens, reward) of the long-context domains among eval results with a run id."""
    out = {}
    for r in results:
        if r.get("run_id") and r.get("long_context"):
            curve = eval_curve(r["run_id"], r["domain"])
            if curve:
                out[r["domain"]] = curve
    return out


def run_samples(results: list[dict[str, Any]]) -> dict[str, Samples]:
    """domain -> per-sample rewards from eval results that carry their eval run id."""
    out = {}
    for r in results:
        if r.get("run_id"):
            samples = eval_samples(r["run_id"], r["domain"])
            if samples is not None:
                out[r["domain"]] = samples
    return out


def ensure_registered_model(c: Any, model_name: str) -> None:
    """Create the registered model unless it exists: every registering path goes through here."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    try:
        c.create_registered_model(model_name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise TrackingError(f"cannot create registered model {model_name}: {mlflow_message(e)}") from None


def lifecycle_version(c: Any, model_name: str, lifecycle_run: str | None) -> Any | None:
    """The version an earlier attempt registered for this lifecycle run (one per run), or None."""
    if not lifecycle_run:
        return None
    found = [mv for mv in c.search_model_versions(f"name = '{model_name}'")
             if mv.tags.get(TAG_LIFECYCLE_RUN) == lifecycle_run]
    return min(found, key=lambda mv: int(mv.version)) if found else None


def register_version(model_name: str, source: str, run_id: str, *, eval_results: dict[str, dict[str, Any]],
                     decision: GateDecision, alias: str, fallback_alias: str, tags: dict[str, str],
                     model_id: str | None = None) -> dict[str, Any]:
    """Create the version, tag it with eval metrics and the gate decision, set the right alias.

    ``model_id``: the logged model behind a ``models:/<model_id>`` source (a tracking server requires it).
    Idempotent per lifecycle run (``tags["temper.lifecycle_run"]``): a retry after a failure past
    the version's creation finishes that version instead of registering a second one, and does not
    record the alias move again when it already happened.
    """
    c = client()
    ensure_registered_model(c, model_name)
    mv = lifecycle_version(c, model_name, tags.get(TAG_LIFECYCLE_RUN)) or c.create_model_version(
        name=model_name, source=source, run_id=run_id, model_id=model_id,
        tags={**tags, **eval_tags(eval_results), TAG_GATE_PASSED: str(decision.passed).lower(),
              TAG_GATE_REASON: decision.reason, TAG_GATE_DELTAS: json.dumps(decision.deltas)})
    version = version_of(mv)
    chosen = alias if decision.passed else fallback_alias
    if aliases_of(registered_model(c, model_name)).get(chosen) != version:
        record_flow_alias(c, model_name, chosen, version, reason=f"post_training gate: {decision.reason}",
                          gate=decision.reason)
    if not decision.passed:
        c.set_model_version_tag(model_name, version, TAG_CANDIDATE_REASON, decision.reason)
    return {"name": model_name, "version": version, "alias": chosen, "source": mv.source}
