"""Training workload: ``python -m workloads.train sft|grpo --config FILE`` on every rank.

Started by ``accelerate launch`` (local launcher or a Kubernetes pod). No Prefect here.
Exit 0 = done, 1 = a TemperError (printed as one line), anything else = a bug.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from infra.sandbox.pool import close_shared
from infra.storage import get_fs
from temper.core.errors import TemperError
from temper.training.progress import quiet_libraries, result_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workloads.train")
    parser.add_argument("mode", choices=["sft", "grpo"])
    parser.add_argument("--config", required=True, help="training config YAML (temper.training.config.TrainConfig): "
                        "a local path, or a store URI (a Kubernetes pod reads the config the flow wrote there)")
    parser.add_argument("--export-to", default=None, help="store URI the exported model is copied to by rank 0 "
                        "(pods: the flow reads the model from there)")
    parser.add_argument("--max-steps", type=int, default=None, help="override max_steps")
    args = parser.parse_args(argv)

    quiet_libraries()  # before torch/transformers are imported

    # lazy: transformers+pydantic_settings+fsspec+... (1.0 s), via config, only for the runs of `-m workloads.train` that need it
    from infra.storage import put_dir
    from temper.training.config import load_config
    from temper.training.run import train

    try:
        cfg = load_config(_local_config(args.config), max_steps=args.max_steps, mode=args.mode)
        result = train(cfg)
        if args.export_to and os.environ.get("RANK", "0") == "0" and result.get("model_dir"):
            put_dir(result["model_dir"], args.export_to)
            print(f"temper: model exported to {args.export_to}", flush=True)
    except TemperError as e:
        print(f"temper: error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        close_shared()  # the reward verifiers' sandbox pods go with the job, not at interpreter exit
    if os.environ.get("RANK", "0") == "0":
        print("\n".join(result_lines(cfg.mode, result)), flush=True)
    return 0


def _local_config(path: str) -> str:
    """A store URI's config copied to a local file (the one YAML reader takes paths); a path as it is."""
    if "://" not in path:
        return path

    fs, remote = get_fs(path)
    fd, local = tempfile.mkstemp(prefix="temper-config-", suffix=".yaml")
    with os.fdopen(fd, "wb") as f:
        f.write(fs.cat_file(remote))
    return local


if __name__ == "__main__":
    sys.exit(main())
