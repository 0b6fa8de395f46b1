"""Prefect tasks: evaluate a model on a set of domains as sharded eval jobs; fetch and tag registered versions."""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import asdict

from prefect import get_run_logger, task

from infra.jobspec import JobSpec, job_name
from infra.storage import get_fs, join
from infra.tracking.connection import configure
from tasks.tracking import MLFLOW_RETRY
from temper.core.errors import TemperError
from temper.core.settings import Backend, get_settings
from temper.lifecycle.eval_reuse import keep_result, load_result, reuse_keys
from temper.lifecycle.evaluation import record_eval, recorded_evals, summary
from temper.lifecycle.execution import execution_for
from temper.lifecycle.params import EvalSettings
from temper.registry.base_deltas import domain_deltas, mean_delta, verdict_counts
from temper.registry.model_store import hf_folder
from temper.registry.samples import eval_samples
from temper.registry.store import client, version_of
from temper.registry.tags import eval_tags, parse_eval_tags
from temper.registry.versions import resolve_version
from temper.training.progress import quiet_env


@task(retries=1, retry_delay_seconds=5, task_run_name="eval-{label}")
def evaluate(model_dir: str, domains: list[str], settings: EvalSettings, label: str,
             parent_run_id: str | None, backend: Backend, reuse: dict[str, str] | None = None) -> list[dict]:
    """Mean reward, pass rate and n of ``model_dir`` on each domain, one MLflow eval run per domain.

    The domains go to ``settings.shards`` eval processes (locally) or Jobs (Kubernetes) at once,
    each loading the model once and taking every shards-th domain (``workloads.evaluate``); each
    writes ``<domain>.json`` where the execution backend says (a local folder, or the store), and
    the results are read back from there the same way for either. ``backend``: the flow's, resolved
    when the flow run started. With a rollout backend in the settings the jobs generate through it.

    ``reuse`` (domain -> dataset digest; the flow gives it for the base model): a domain whose result with the
    same model, data, settings and code is kept in the store (``temper.lifecycle.eval_reuse``) is recorded from
    there, tagged with the run that computed it, and gets no job; what is computed is kept for the next run.
    """
    logger = get_run_logger()
    if parent_run_id and (done := recorded_evals(parent_run_id, label, domains)) is not None:
        logger.info("eval-%s: every domain's result was recorded by an earlier attempt of this run", label)
        return done
    keys = reuse_keys(model_dir, reuse, settings.limit, settings.max_new_tokens) if reuse and parent_run_id else {}
    kept = {d: r for d in domains if d in keys and (r := load_result(keys[d])) is not None}
    if kept:
        logger.info("eval-%s: %d of %d domain(s) reused from earlier runs with the same model, data, settings and "
                    "code", label, len(kept), len(domains))
    fresh = _run_eval_jobs(model_dir, [d for d in domains if d not in kept], settings, label, parent_run_id, backend)
    results = []
    for domain in domains:
        result = kept.get(domain) or fresh[domain]
        logger.info("%s on %s: mean reward %.3f, pass rate %.3f (n=%d)%s", label, domain, result["mean_reward"],
                    result["pass_rate"], result["n"], " (reused)" if domain in kept else "")
        if parent_run_id:
            result["run_id"] = record_eval(result, label, parent_run_id, reused_from=result.get("computed_by"))
            if domain in keys and domain not in kept:
                keep_result(keys[domain], result, result["run_id"], reuse[domain])
        results.append(summary(result))
    return results


def _run_eval_jobs(model_dir: str, domains: list[str], settings: EvalSettings, label: str,
                   parent_run_id: str | None, backend: Backend) -> dict[str, dict]:
    """The eval jobs of ``domains`` (sharded), their results read back: domain -> result."""
    if not domains:
        return {}
    logger = get_run_logger()
    execution = execution_for(backend)
    shards = max(1, min(settings.shards, len(domains)))
    name = job_name(f"eval-{label}", parent_run_id or uuid.uuid4().hex, max_len=44)  # room for -s<shard>
    out = execution.eval_out(name)
    command = [sys.executable, "-m", "workloads.evaluate", "--model", execution.share(model_dir), "--limit",
               str(settings.limit), "--max-new-tokens", str(settings.max_new_tokens), "--out", out]
    command += [a for d in domains for a in ("--domain", d)]
    command += ["--generator", "rollout"] if get_settings().rollout.backend else []
    # the libraries quiet, as in training jobs (their progress bars are no log lines)
    spec = JobSpec(name=name, kind="eval", timeout_s=3600, command=command, env={"OMP_NUM_THREADS": "1", **quiet_env()})
    execution.run(spec, lambda line: logger.debug("[eval-%s] %s", label, line), shards=shards)
    fs, root = get_fs(out)
    missing = [d for d in domains if not fs.exists(join(root, f"{d}.json"))]
    if missing:
        raise TemperError(f"eval job {name} succeeded but {len(missing)} domain(s) have no result in {out}: "
                          + ", ".join(missing[:10]))
    return {d: json.loads(fs.cat_file(join(root, f"{d}.json"))) for d in domains}


@task(**MLFLOW_RETRY, task_run_name="fetch-{model_name}-{version}")
def fetch_model(model_name: str, version: str) -> dict:
    """A registered version (number or alias) as a local HF folder the eval jobs can read (either layout)."""
    configure()
    mv = resolve_version(client(), model_name, version)
    number = version_of(mv)
    target = hf_folder(mv.source, get_settings().home.resolve() / "cache" / "registry" / model_name / number)
    trained = sorted(d for d, m in parse_eval_tags(mv.tags).items() if "mean_reward" in m)
    return {"version": number, "model_dir": str(target), "run_id": mv.run_id, "evaluated_domains": trained}


@task(**MLFLOW_RETRY)
def tag_version(model_name: str, version: str, results: list[dict]) -> None:
    """Write the eval summary onto the version, where the gate and `temper models` read it."""
    # lazy: mlflow (1.6 s) would load whenever flows.evaluate is imported
    from mlflow.tracking import MlflowClient

    configure()
    client = MlflowClient()
    for key, value in eval_tags({r["domain"]: r for r in results}).items():
        client.set_model_version_tag(model_name, version, key, value)


@task(**MLFLOW_RETRY)
def compare_to_base(before: list[dict], after: list[dict], trained: list[str], alpha: float) -> dict:
    """Per-domain paired intervals and Holm verdicts of candidate vs base, from the per-sample rewards the eval
    runs logged; the means over the trained and the held-out (eval-only) domains with their intervals."""
    configure()
    base = {r["domain"]: eval_samples(r["run_id"], r["domain"]) or [] for r in before if r.get("run_id")}
    cand = {r["domain"]: eval_samples(r["run_id"], r["domain"]) or [] for r in after if r.get("run_id")}
    deltas = domain_deltas(base, cand, alpha)
    held = sorted(set(cand) - set(trained))
    trained = [d for d in trained if d in cand]
    means = {"trained": mean_delta(base, cand, trained), "held_out": mean_delta(base, cand, held)}
    return {"domains": {d: x.to_dict() for d, x in deltas.items()}, "trained": trained, "held_out": held,
            "counts": {"trained": verdict_counts(deltas, trained), "held_out": verdict_counts(deltas, held)},
            "means": {k: (asdict(m) if m else None) for k, m in means.items()}}
