"""``temper train sft|grpo --config FILE``: run a training workload through the local launcher."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="SFT or multi-domain GRPO on DeepSpeed ZeRO-3")
    p.add_argument("mode", choices=["sft", "grpo"])
    p.add_argument("--config", required=True, help="training config YAML")
    p.add_argument("--max-steps", type=int, default=None, help="override max_steps")
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    from infra.launcher_local import run_job
    from temper.training.job import training_job

    spec = training_job(args.config, args.mode, args.max_steps)
    return run_job(spec, on_line=lambda line: print(line, flush=True))
