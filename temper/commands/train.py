"""``temper train sft|grpo --config FILE``: run a training workload through the local launcher.

The config is validated before any rank starts. The ranks' own lines (one per logging step,
checkpoints, where the result is) are shown; library output goes to ``<output_dir>/train.log``
(``--verbose`` shows it too), and its last lines are printed if the job fails.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="SFT or multi-domain GRPO on DeepSpeed ZeRO-3",
                              description="Examples: configs/train/sft.yaml, configs/train/grpo.yaml.")
    p.add_argument("mode", choices=["sft", "grpo"])
    p.add_argument("--config", required=True, help="training config YAML (see configs/train/)")
    p.add_argument("--max-steps", type=int, default=None, help="override the stage's max_steps")
    p.add_argument("--verbose", action="store_true", help="also show library output (always in <output_dir>/train.log)")
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    # lazy: pydantic_settings+yaml (141 ms), via launcher_local, would load at every `temper` start-up
    from infra.launcher_local import run_job
    from temper.training.config import load_config
    from temper.training.job import preflight, training_job
    from temper.training.progress import is_progress

    cfg = load_config(args.config, max_steps=args.max_steps, mode=args.mode)  # one line on error, no rank started
    preflight(cfg)
    spec = training_job(args.config, args.mode, args.max_steps)
    log_path = Path(cfg.output_dir) / "train.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=30)
    errors: list[str] = []
    print(f"temper: {args.mode} {cfg.run_name}: {cfg.stage.max_steps} steps on {cfg.world_size} rank(s); "
          f"full output in {log_path}", flush=True)
    with open(log_path, "a") as log:
        def on_line(line: str) -> None:
            log.write(line + "\n")
            tail.append(line)
            if line in errors:
                return  # every rank reports the same error: show it once
            if line.startswith("temper: error:"):
                errors.append(line)
            if args.verbose or is_progress(line):
                print(line, flush=True)

        status = run_job(spec, on_line=on_line)
    if status != 0 and not args.verbose:
        if errors:  # the ranks said why (already shown): the launcher's traceback would only bury it
            print(f"temper: {spec.name} failed (exit {status}); full output in {log_path}", file=sys.stderr)
        else:
            print(f"temper: {spec.name} failed (exit {status}); last lines of {log_path}:", file=sys.stderr)
            print("\n".join(tail), file=sys.stderr)
    return status
