"""Training workload: ``python -m workloads.train sft|grpo --config FILE`` on every rank.

Started by ``accelerate launch`` (local launcher or a Kubernetes pod). No Prefect here.
Exit 0 = done, 1 = a TemperError (printed as one line), anything else = a bug.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workloads.train")
    parser.add_argument("mode", choices=["sft", "grpo"])
    parser.add_argument("--config", required=True, help="training config YAML (temper.training.config.TrainConfig)")
    parser.add_argument("--max-steps", type=int, default=None, help="override max_steps")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from temper.errors import TemperError
    from temper.training.config import TrainingError, load_config
    from temper.training.run import train

    try:
        overrides = {"max_steps": args.max_steps} if args.max_steps else {}
        cfg = load_config(args.config, overrides)
        if cfg.mode != args.mode:
            raise TrainingError(f"{args.config}: config is for mode {cfg.mode!r}, command asked for {args.mode!r}")
        result = train(cfg)
    except TemperError as e:
        print(f"temper: error: {e}", file=sys.stderr, flush=True)
        return 1
    if os.environ.get("RANK", "0") == "0":
        print("temper: result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
