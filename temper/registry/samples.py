"""Per-sample eval rewards and the stage runs of a lifecycle run.

The post_training flow evaluates the base model and the candidate under the same lifecycle run
(``eval-base-<domain>``, ``eval-candidate-<domain>``), told apart by the run tag
``temper.eval.label``. A version's samples are its *candidate* evals only: reading the base
model's as the version's made two identical runs look different in ``temper models compare``.
"""

from __future__ import annotations

import json
from typing import Any

from temper.core.errors import TrackingError
from temper.core.tag_names import (
    PARENT_TAG,
    TAG_CONTEXT_CURVE,
    TAG_DOMAIN,
    TAG_EVAL_LABEL,
    TAG_LIFECYCLE_RUN,
    TAG_STAGE,
)
from temper.registry.store import client, mlflow_message

EVAL_SAMPLES_ARTIFACT = "eval/{domain}.jsonl"
VERSION_LABEL = "candidate"  # the label of the evals that belong to the registered version

Samples = list[tuple[str, float | None]]


def log_eval_samples(domain: str, rewards: Samples, tokens: list[int] | None = None,
                     episodes: list[dict[str, Any]] | None = None) -> str:
    """Log per-sample rewards of one domain's eval to the active MLflow run; returns the artifact path.

    One JSON object per line, ``{"id": ..., "reward": ...}`` (reward ``null`` = not scored),
    at ``eval/<domain>.jsonl``, plus ``"tokens"`` (the prompt's length) for long-context domains and
    ``"turns"``/``"outcome"`` (``episodes``: per sample, e.g. ``{"turns": 3, "outcome": "done"}``) for
    multi-step ones.
    Mean reward and pass rate on the version are summaries; these samples are what ``temper models
    compare`` and the gate bootstrap their intervals (and effective context lengths) from.
    """
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow

    if mlflow.active_run() is None:
        raise TrackingError(f"log_eval_samples({domain!r}): no active MLflow run to log to")
    path = EVAL_SAMPLES_ARTIFACT.format(domain=domain)
    lines = [json.dumps({"id": str(sample_id), "reward": None if r is None else float(r)}
                        | ({"tokens": int(tokens[i])} if tokens else {}) | (episodes[i] if episodes else {}))
             for i, (sample_id, r) in enumerate(rewards)]
    mlflow.log_text("\n".join(lines) + ("\n" if lines else ""), path)
    return path


def _sample_lines(text: str) -> list[tuple[dict, float | None]]:
    """Each line of the ``log_eval_samples`` format (blank lines ignored): (its object, its reward)."""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [(obj, None if obj.get("reward") is None else float(obj["reward"])) for obj in rows]


def parse_eval_samples(text: str) -> Samples:
    """The inverse of the ``log_eval_samples`` format: (id, reward) per sample."""
    return [(str(obj["id"]), reward) for obj, reward in _sample_lines(text)]


def parse_context_curve(text: str) -> list[tuple[int, float | None]]:
    """(prompt tokens, reward) of the samples that carry their length; [] for an ordinary domain."""
    return [(int(obj["tokens"]), reward) for obj, reward in _sample_lines(text) if "tokens" in obj]


def _samples_text(run_id: str, domain: str) -> str | None:
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow
    from mlflow.exceptions import MlflowException

    path = EVAL_SAMPLES_ARTIFACT.format(domain=domain)
    try:
        present = {a.path for a in client().list_artifacts(run_id, path.rsplit("/", 1)[0])}
        if path not in present:
            return None
        return mlflow.artifacts.load_text(f"runs:/{run_id}/{path}")
    except MlflowException as e:
        raise TrackingError(f"cannot read {path} of run {run_id}: {mlflow_message(e)}") from None


def eval_samples(run_id: str, domain: str) -> Samples | None:
    """Per-sample rewards of ``domain`` logged on run ``run_id``; None when that run has none."""
    text = _samples_text(run_id, domain)
    return None if text is None else parse_eval_samples(text)


def eval_curve(run_id: str, domain: str) -> list[tuple[int, float | None]] | None:
    """(prompt tokens, reward) per sample of a long-context domain's eval run; None for any other run."""
    text = _samples_text(run_id, domain)
    return (parse_context_curve(text) or None) if text is not None else None


def lifecycle_run_id(mv: Any) -> str | None:
    """The lifecycle (parent) run that produced a model version: its tag, else its run's parent."""
    if mv.tags.get(TAG_LIFECYCLE_RUN):
        return mv.tags[TAG_LIFECYCLE_RUN]
    if not mv.run_id:
        return None
    return client().get_run(mv.run_id).data.tags.get(PARENT_TAG)


def stage_runs(lifecycle_id: str) -> list[Any]:
    """Child runs (validate, sft, grpo, eval, register, ...) of a lifecycle run, oldest first."""
    c = client()
    parent = c.get_run(lifecycle_id)
    return c.search_runs([parent.info.experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{lifecycle_id}'",
                         order_by=["attributes.start_time ASC"], max_results=1000)


def is_version_eval(tags: dict[str, str]) -> bool:
    """An eval stage run of the version itself: the candidate's, or unlabelled (runs logged before labels)."""
    return tags.get(TAG_STAGE) == "eval" and tags.get(TAG_EVAL_LABEL, VERSION_LABEL) == VERSION_LABEL


def _version_evals(mv: Any, only_curves: bool = False):
    """(eval run id, domain) of each candidate eval of the version's lifecycle run."""
    lifecycle = lifecycle_run_id(mv)
    if not lifecycle:
        return
    for run in stage_runs(lifecycle):
        if not is_version_eval(run.data.tags) or (only_curves and run.data.tags.get(TAG_CONTEXT_CURVE) != "true"):
            continue
        domains = [run.data.tags[TAG_DOMAIN]] if run.data.tags.get(TAG_DOMAIN) else \
            [a.path.removeprefix("eval/").removesuffix(".jsonl")
             for a in client().list_artifacts(run.info.run_id, "eval") if a.path.endswith(".jsonl")]
        for d in domains:
            yield run.info.run_id, d


def version_samples(mv: Any) -> dict[str, Samples]:
    """domain -> per-sample rewards of the version, from the candidate eval runs of its lifecycle run.

    Each eval run may hold one or more ``eval/<domain>.jsonl``. A version without a lifecycle
    run has no samples.
    """
    out: dict[str, Samples] = {}
    for run_id, d in _version_evals(mv):
        samples = eval_samples(run_id, d)
        if samples is not None:
            out[d] = samples
    return out


def version_curves(mv: Any) -> dict[str, list[tuple[int, float | None]]]:
    """domain -> (prompt tokens, reward) per sample, for the version's long-context domains only."""
    out = {}
    for run_id, d in _version_evals(mv, only_curves=True):
        curve = eval_curve(run_id, d)
        if curve:
            out[d] = curve
    return out
