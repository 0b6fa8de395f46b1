"""Training workload: ``python -m workloads.train sft|grpo --config FILE`` on every rank.

Started by ``accelerate launch`` (local launcher or a Kubernetes pod). No Prefect here.
Exit 0 = done, 1 = a TemperError (printed as one line), anything else = a bug.
"""

from __future__ import annotations

import argparse
import os
import sys

from temper.core.errors import TemperError
from temper.training.progress import quiet_libraries, result_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workloads.train")
    parser.add_argument("mode", choices=["sft", "grpo"])
    parser.add_argument("--config", required=True, help="training config YAML (temper.training.config.TrainConfig)")
    parser.add_argument("--max-steps", type=int, default=None, help="override max_steps")
    args = parser.parse_args(argv)

    quiet_libraries()  # before torch/transformers are imported

    # lazy: transformers+pydantic_settings+fsspec+... (1.0 s), via config, only for the runs of `-m workloads.train` that need it
    from temper.training.config import load_config
    from temper.training.run import train

    try:
        cfg = load_config(args.config, max_steps=args.max_steps, mode=args.mode)
        result = train(cfg)
    except TemperError as e:
        print(f"temper: error: {e}", file=sys.stderr, flush=True)
        return 1
    if os.environ.get("RANK", "0") == "0":
        print("\n".join(result_lines(cfg.mode, result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
