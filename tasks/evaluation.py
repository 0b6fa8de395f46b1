"""Prefect tasks: evaluate a model on a set of domains as sharded eval jobs; fetch and tag registered versions."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prefect import get_run_logger, task

from infra import lineage
from infra.jobspec import JobSpec
from infra.launcher_local import run_job
from temper.core.errors import TemperError
from temper.core.settings import get_settings
from temper.lifecycle.evaluation import record_eval, summary
from temper.lifecycle.params import EvalSettings
from temper.registry.model_store import hf_folder
from temper.registry.store import client, version_of
from temper.registry.tags import eval_tags, parse_eval_tags
from temper.registry.versions import resolve_version


@task(retries=1, retry_delay_seconds=5, task_run_name="eval-{label}")
def evaluate(model_dir: str, domains: list[str], settings: EvalSettings, label: str,
             parent_run_id: str | None = None) -> list[dict]:
    """Mean reward, pass rate and n of ``model_dir`` on each domain, one MLflow eval run per domain.

    The domains go to ``settings.shards`` eval processes (locally) or Jobs (Kubernetes) at once,
    each loading the model once and taking every shards-th domain (``workloads.evaluate``).
    """
    logger = get_run_logger()
    out = Path(tempfile.mkdtemp(prefix="temper-eval-"))
    shards = max(1, min(settings.shards, len(domains)))
    base = re.sub(r"[^a-z0-9-]", "-", f"eval-{label}".lower())[:44].strip("-")
    command = [sys.executable, "-m", "workloads.evaluate", "--model", model_dir, "--limit", str(settings.limit),
               "--max-new-tokens", str(settings.max_new_tokens), "--out", str(out)]
    command += [a for d in domains for a in ("--domain", d)]
    command += ["--generator", "rollout"] if os.environ.get("TEMPER_ROLLOUT_BACKEND") else []
    specs = [JobSpec(name=f"{base}-s{i}" if shards > 1 else base, kind="eval", timeout_s=3600, command=command,
                     env={"OMP_NUM_THREADS": "1", "TEMPER_SHARD_INDEX": str(i), "TEMPER_NUM_SHARDS": str(shards)})
             for i in range(shards)]
    logs: list[list[str]] = [[] for _ in specs]
    with ThreadPoolExecutor(len(specs)) as pool:
        statuses = list(pool.map(lambda i: run_job(specs[i], on_line=logs[i].append), range(len(specs))))
    missing = [d for d in domains if not (out / f"{d}.json").exists()]
    if any(statuses) or missing:
        bad = next((i for i, st in enumerate(statuses) if st), 0)
        raise TemperError(f"eval job {specs[bad].name} failed with exit status {statuses[bad]} "
                          f"({len(missing)} domain(s) without a result):\n" + "\n".join(logs[bad][-30:]))
    results = []
    for domain in domains:
        result = json.loads((out / f"{domain}.json").read_text())
        logger.info("%s on %s: mean reward %.3f, pass rate %.3f (n=%d)", label, domain, result["mean_reward"],
                    result["pass_rate"], result["n"])
        if parent_run_id:
            result["run_id"] = record_eval(result, label, parent_run_id)
        results.append(summary(result))
    return results


@task(retries=3, retry_delay_seconds=[2, 5, 15], task_run_name="fetch-{model_name}-{version}")
def fetch_model(model_name: str, version: str) -> dict:
    """A registered version (number or alias) as a local HF folder the eval jobs can read (either layout)."""
    lineage.configure()
    mv = resolve_version(client(), model_name, version)
    number = version_of(mv)
    target = hf_folder(mv.source, get_settings().home.resolve() / "cache" / "registry" / model_name / number)
    trained = sorted(d for d, m in parse_eval_tags(mv.tags).items() if "mean_reward" in m)
    return {"version": number, "model_dir": str(target), "run_id": mv.run_id, "evaluated_domains": trained}


@task(retries=3, retry_delay_seconds=[2, 5, 15])
def tag_version(model_name: str, version: str, results: list[dict]) -> None:
    """Write the eval summary onto the version, where the gate and `temper models` read it."""
    # lazy: mlflow (1.6 s) would load whenever flows.evaluate is imported
    from mlflow.tracking import MlflowClient

    lineage.configure()
    client = MlflowClient()
    for key, value in eval_tags({r["domain"]: r for r in results}).items():
        client.set_model_version_tag(model_name, version, key, value)
