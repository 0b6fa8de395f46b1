"""Prefect task: one eval job per (model, domain), run as its own process like a Kubernetes eval Job."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

from prefect import get_run_logger, task

from temper.lifecycle import EvalSettings


@task(retries=1, retry_delay_seconds=5, task_run_name="eval-{label}-{domain}")
def evaluate(model_dir: str, domain: str, settings: EvalSettings, label: str, parent_run_id: str | None = None) -> dict:
    """Mean reward, pass rate and n of ``model_dir`` on ``domain``; recorded as an MLflow eval run."""
    from infra.jobspec import JobSpec
    from infra.launcher_local import run_job
    from temper.errors import TemperError
    from temper.evaluation import record_eval, summary

    logger = get_run_logger()
    out = Path(tempfile.mkdtemp(prefix="temper-eval-")) / "result.json"
    name = re.sub(r"[^a-z0-9-]", "-", f"eval-{label}-{domain}".lower())[:52].strip("-")
    spec = JobSpec(name=name, kind="eval", timeout_s=3600, env={"OMP_NUM_THREADS": "1"},
                   command=[sys.executable, "-m", "workloads.evaluate", "--model", model_dir, "--domain", domain,
                            "--limit", str(settings.limit), "--max-new-tokens", str(settings.max_new_tokens),
                            "--out", str(out)]
                   + (["--generator", "rollout"] if os.environ.get("TEMPER_ROLLOUT_BACKEND") else []))
    lines: list[str] = []
    status = run_job(spec, on_line=lines.append)
    if status != 0 or not out.exists():
        raise TemperError(f"eval job {name} failed with exit status {status}:\n" + "\n".join(lines[-30:]))
    result = json.loads(out.read_text())
    logger.info("%s on %s: mean reward %.3f, pass rate %.3f (n=%d)", label, domain, result["mean_reward"],
                result["pass_rate"], result["n"])
    if parent_run_id:
        result["run_id"] = record_eval(result, label, parent_run_id)
    return summary(result)


@task(retries=3, retry_delay_seconds=[2, 5, 15], task_run_name="fetch-{model_name}-{version}")
def fetch_model(model_name: str, version: str) -> dict:
    """A registered version (number or alias) downloaded to a local folder the eval jobs can read."""
    from mlflow.artifacts import download_artifacts

    from infra import lineage
    from temper.registry.store import client, version_of
    from temper.registry.tags import parse_eval_tags
    from temper.registry.versions import resolve_version
    from temper.settings import get_settings

    lineage.configure()
    mv = resolve_version(client(), model_name, version)
    number = version_of(mv)
    target = get_settings().home.resolve() / "cache" / "registry" / model_name / number
    if not (target / "config.json").exists():
        download_artifacts(artifact_uri=mv.source, dst_path=str(target.parent / f"{number}.partial"))
        (target.parent / f"{number}.partial" / "model").rename(target)
    trained = sorted(d for d, m in parse_eval_tags(mv.tags).items() if "mean_reward" in m)
    return {"version": number, "model_dir": str(target), "run_id": mv.run_id, "evaluated_domains": trained}


@task(retries=3, retry_delay_seconds=[2, 5, 15])
def tag_version(model_name: str, version: str, results: list[dict]) -> None:
    """Write the eval summary onto the version, where the gate and `temper models` read it."""
    from mlflow.tracking import MlflowClient

    from infra import lineage
    from temper.registry.tags import eval_tags

    lineage.configure()
    client = MlflowClient()
    for key, value in eval_tags({r["domain"]: r for r in results}).items():
        client.set_model_version_tag(model_name, version, key, value)
