"""Runs one training job with its output folder on a small tmpfs: `python disk_full_job.py CONFIG MODE SIZE`.

Started under `unshare --user --map-root-user --mount` by test_training.py, so the tmpfs exists only
in this process's private mount namespace (and its ranks'), and is gone when the job ends. Prints
{"status": exit status, "lines": the job's output} as JSON on its last line.
"""

import json
import subprocess
import sys
from pathlib import Path

import yaml

from infra.launcher_local import run_job
from temper.training.job import training_job

config, mode, size = sys.argv[1:4]
out = Path(yaml.safe_load(Path(config).read_text())["output_dir"])
out.mkdir(parents=True, exist_ok=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(out)], check=True)
lines: list[str] = []
status = run_job(training_job(config, mode), on_line=lines.append, cwd=str(Path(__file__).resolve().parents[2]))
print(json.dumps({"status": status, "lines": lines}))
