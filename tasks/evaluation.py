"""Prefect task: one eval job per (model, domain), run as its own process like a Kubernetes eval Job."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

from prefect import get_run_logger, task

from temper.lifecycle import EvalSettings


@task(retries=1, retry_delay_seconds=5, task_run_name="eval-{label}-{domain}")
def evaluate(model_dir: str, domain: str, settings: EvalSettings, label: str) -> dict:
    """Returns the eval result (mean_reward, pass_rate, n, per-sample rewards) of ``model_dir`` on ``domain``."""
    from infra.jobspec import JobSpec
    from infra.launcher_local import run_job
    from temper.errors import TemperError

    logger = get_run_logger()
    out = Path(tempfile.mkdtemp(prefix="temper-eval-")) / "result.json"
    name = re.sub(r"[^a-z0-9-]", "-", f"eval-{label}-{domain}".lower())[:52].strip("-")
    spec = JobSpec(name=name, kind="eval", timeout_s=3600, env={"OMP_NUM_THREADS": "1"},
                   command=[sys.executable, "-m", "workloads.evaluate", "--model", model_dir, "--domain", domain,
                            "--limit", str(settings.limit), "--max-new-tokens", str(settings.max_new_tokens),
                            "--out", str(out)])
    status = run_job(spec, on_line=lambda line: logger.info("[%s] %s", name, line))
    if status != 0 or not out.exists():
        raise TemperError(f"eval job {name} failed with exit status {status}")
    return json.loads(out.read_text())
