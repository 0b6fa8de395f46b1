"""Model registry operations over MLflow: the champion's eval metrics, registering a version, aliases.

Eval results live on the model version as tags (``temper.eval.<domain>.mean_reward`` ...),
so comparing a candidate with the champion needs no search over runs.
"""

from __future__ import annotations

import json
from typing import Any

from temper.core.errors import TrackingError
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


def ensure_registered_model(client: Any, model_name: str) -> None:
    """Create the registered model unless it exists: every registering path goes through here."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(model_name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise TrackingError(f"cannot create registered model {model_name}: {e.message}") from None


def register_version(model_name: str, source: str, run_id: str, *, eval_results: dict[str, dict[str, Any]],
                     decision: GateDecision, alias: str, fallback_alias: str, tags: dict[str, str],
                     model_id: str | None = None) -> dict[str, Any]:
    """Create the version, tag it with eval metrics and the gate decision, set the right alias.

    ``model_id``: the logged model behind a ``models:/<model_id>`` source (a tracking server requires it).
    """
    client = _client()
    ensure_registered_model(client, model_name)
    mv = client.create_model_version(
        name=model_name, source=source, run_id=run_id, model_id=model_id,
        tags={**tags, **eval_tags(eval_results), "temper.gate.passed": str(decision.passed).lower(),
              "temper.gate.reason": decision.reason, "temper.gate.deltas": json.dumps(decision.deltas)})
    from temper.registry_ops import record_flow_alias  # registry_ops builds on this module

    chosen = alias if decision.passed else fallback_alias
    record_flow_alias(client, model_name, chosen, mv.version, reason=f"post_training gate: {decision.reason}",
                      gate=decision.reason)
    if not decision.passed:
        client.set_model_version_tag(model_name, mv.version, "temper.candidate_reason", decision.reason)
    return {"name": model_name, "version": mv.version, "alias": chosen, "source": source}


# ---- shared with registry operations (temper/registry_ops.py) and the eval flow ---------------

EVAL_SAMPLES_ARTIFACT = "eval/{domain}.jsonl"
LIFECYCLE_RUN_TAG = "temper.lifecycle_run"


class RegistryError(TrackingError):
    """A model, version or alias does not exist, or a registry operation cannot be done as asked.

    A TrackingError, so callers that catch tracking failures also catch these; the message
    always names the model/version/alias at fault.
    """


def log_eval_samples(domain: str, rewards: list[tuple[str, float | None]]) -> str:
    """Log per-sample rewards of one domain's eval to the active MLflow run; returns the artifact path.

    One JSON object per line, ``{"id": ..., "reward": ...}`` (reward ``null`` = not scored),
    at ``eval/<domain>.jsonl``. Mean reward and pass rate on the version are summaries; these
    samples are what ``temper models compare`` bootstraps its intervals from.
    """
    import mlflow

    if mlflow.active_run() is None:
        raise TrackingError(f"log_eval_samples({domain!r}): no active MLflow run to log to")
    path = EVAL_SAMPLES_ARTIFACT.format(domain=domain)
    lines = [json.dumps({"id": str(sample_id), "reward": None if r is None else float(r)}) for sample_id, r in rewards]
    mlflow.log_text("\n".join(lines) + ("\n" if lines else ""), path)
    return path


def parse_eval_samples(text: str) -> list[tuple[str, float | None]]:
    """The inverse of the ``log_eval_samples`` format (blank lines ignored)."""
    out = []
    for line in text.splitlines():
        if line.strip():
            obj = json.loads(line)
            out.append((str(obj["id"]), None if obj.get("reward") is None else float(obj["reward"])))
    return out


def eval_samples(run_id: str, domain: str) -> list[tuple[str, float | None]] | None:
    """Per-sample rewards of ``domain`` logged on run ``run_id``; None when that run has none."""
    import mlflow
    from mlflow.exceptions import MlflowException

    path = EVAL_SAMPLES_ARTIFACT.format(domain=domain)
    client = _client()
    try:
        present = {a.path for a in client.list_artifacts(run_id, path.rsplit("/", 1)[0])}
        if path not in present:
            return None
        return parse_eval_samples(mlflow.artifacts.load_text(f"runs:/{run_id}/{path}"))
    except MlflowException as e:
        raise TrackingError(f"cannot read {path} of run {run_id}: {e.message.splitlines()[0]}") from None


def lifecycle_run_id(mv: Any) -> str | None:
    """The lifecycle (parent) run that produced a model version: its tag, else its run's parent."""
    if mv.tags.get(LIFECYCLE_RUN_TAG):
        return mv.tags[LIFECYCLE_RUN_TAG]
    if not mv.run_id:
        return None
    return _client().get_run(mv.run_id).data.tags.get("mlflow.parentRunId")


def stage_runs(lifecycle_id: str) -> list[Any]:
    """Child runs (validate, sft, grpo, eval, register, ...) of a lifecycle run, oldest first."""
    client = _client()
    parent = client.get_run(lifecycle_id)
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{lifecycle_id}'",
                              order_by=["attributes.start_time ASC"], max_results=1000)
