"""Training cost: ZeRO-3 on 2 ranks vs one plain process, and temper's GRPO step vs bare TRL.

One tiny random model (``temper.training.tiny.init_tiny``), the arithmetic + multiplication
domains of the shipped catalog, GRPO, every run launched like production: a TrainConfig YAML ->
``training_job(path, "grpo")`` -> ``infra.launcher_local.run_job`` (``accelerate launch`` for
ZeRO-3; the bare TRL script through the same launcher, same env, e.g. OMP_NUM_THREADS=1).

Runs (same model, same rows in the same order, same global batch: 4 prompts x 4 generations):
* temper ZeRO-3: deepspeed=True, world_size=2, per_device_batch_size=8;
* temper single: deepspeed=False, world_size=1, per_device_batch_size=16 (the baseline of ZeRO-3);
* bare TRL: benchmarks/bare_trl_grpo.py, one process, the GRPOConfig values temper's run uses
  (checked field by field against ``temper.training.trl_args.trl_config``), the rows temper's domain
  sampler produced, a plain-function numeric reward, no temper callback (the baseline of temper).
temper single and bare TRL alternate (single, bare, bare, single, ...) and ZeRO-3 runs first and
last, so drift on a noisy machine hits every kind alike.

Per run, over the steps after the first ``--warmup``:
* step time: median of on_step_begin -> on_step_end (TemperCallback's step_time_s; the bare script
  measures it the same way), and the median log-to-log interval (everything between two steps,
  callbacks and logging included; = tokens between two logs / tokens_per_s);
* tokens/s: median tokens_per_s (num_tokens is global, all ranks);
* CPU s/step: CPU seconds burnt by all ranks between the warm-up-th and the last metrics line
  (sampled from the rank processes; robust to other load on the machine, unlike wall time);
* peak RSS per rank: VmHWM (the kernel's high-water mark) of each rank process, polled every 0.1 s
  over the launcher's descendants (the accelerate launcher itself excluded).

Run: .venv/bin/python benchmarks/train.py [--steps 100] [--warmup 10] [--rounds 3] [--quick]
(default: 2 ZeRO-3 runs + 3 single + 3 bare, ~4-5 min on 2 cores; --quick: 1 of each, ~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from temper.training.config import nest_stage_fields  # noqa: E402
from workspace import embedded_workspace  # noqa: E402 (benchmarks/workspace.py)

DOMAINS = ["arithmetic", "multiplication"]
GLOBAL_BATCH = 16  # completions per optimizer step = 4 prompts x num_generations 4


@dataclass
class RunResult:
    label: str
    wall_s: float
    rows: list[dict]
    peak_rss_mb: dict[int, float]
    cpu_per_step: float | None
    extra: dict = field(default_factory=dict)


class RankMonitor:
    """Polls the rank processes among this process's descendants: VmHWM per rank, CPU at step marks."""

    def __init__(self, metrics: Path, warmup: int, steps: int, marker: str) -> None:
        self.metrics, self.warmup, self.steps, self.marker = metrics, warmup, steps, marker
        self.peak_kb: dict[int, int] = {}
        self.cpu: dict[int, float] = {}  # pid -> last cumulative CPU seconds seen
        self.cpu_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _ranks(self):
        import psutil

        for p in psutil.Process().children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
                if self.marker not in cmd or "accelerate.commands.launch" in cmd:
                    continue
                yield p, int(p.environ().get("RANK", "0"))
            except (psutil.Error, ValueError):
                continue

    def _lines(self) -> int:
        try:
            return sum(1 for _ in self.metrics.open())
        except OSError:
            return 0

    def _loop(self) -> None:
        import psutil

        while not self._stop.wait(0.1):
            for p, rank in self._ranks():
                try:
                    for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            self.peak_kb[rank] = max(self.peak_kb.get(rank, 0), int(line.split()[1]))
                    t = p.cpu_times()
                    self.cpu[p.pid] = t.user + t.system
                except (OSError, psutil.Error):
                    pass
            n = self._lines()
            total = sum(self.cpu.values())
            if n >= self.warmup and "start" not in self.cpu_at:
                self.cpu_at["start"], self.cpu_at["start_line"] = total, n
            if n >= self.steps and "end" not in self.cpu_at:
                self.cpu_at["end"], self.cpu_at["end_line"] = total, n

    def cpu_per_step(self) -> float | None:
        c = self.cpu_at
        if "start" in c and "end" in c and c["end_line"] > c["start_line"]:
            return (c["end"] - c["start"]) / (c["end_line"] - c["start_line"])
        return None


def write_config(root: Path, name: str, **fields) -> Path:
    base = {"mode": "grpo", "run_name": name, "base_model": str(root / "tiny"), "domains": DOMAINS,
            "output_dir": str(root / name), "tracking": False, "export": False, "save_steps": 1000, "seed": 0,
            "learning_rate": 1e-4, "num_generations": 4, "max_completion_length": 8, "temperature": 1.0,
            "beta": 0.04}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(nest_stage_fields({**base, **fields})))
    return path


def bare_args(cfg, output_dir: str, cuda: bool = False, bf16: bool = False) -> dict:
    """The GRPOConfig keyword arguments of the bare run: temper's values (checked in check_same_args)."""
    s = cfg.stage
    return dict(output_dir=output_dir, max_steps=s.max_steps, per_device_train_batch_size=s.per_device_batch_size,
                gradient_accumulation_steps=1, learning_rate=s.learning_rate, lr_scheduler_type=s.lr_scheduler_type,
                warmup_steps=s.warmup_steps, weight_decay=s.weight_decay, seed=cfg.seed, data_seed=cfg.seed,
                logging_steps=1, save_strategy="steps", save_steps=s.checkpoint_every,
                save_total_limit=s.save_total_limit, report_to=[], optim="adamw_torch", use_cpu=not cuda, bf16=bf16,
                fp16=False, dataloader_num_workers=0, disable_tqdm=True, train_sampling_strategy="sequential",
                remove_unused_columns=False, num_generations=s.num_generations,
                max_completion_length=s.max_completion_length, temperature=s.temperature, beta=s.beta,
                shuffle_dataset=False, log_completions=False)


def check_same_args(cfg, kwargs: dict) -> int:
    """Every GRPOConfig field (bar output_dir) of the bare run equals the one temper's run builds."""
    from accelerate import PartialState
    from trl import GRPOConfig

    from temper.training.device import rank_placement
    from temper.training.trl_args import trl_config

    placement = rank_placement(cfg.precision)
    PartialState(cpu=not placement.cuda)  # as temper.training.run.train does before building its args
    ours, bare = trl_config(cfg, None, placement).to_dict(), GRPOConfig(**kwargs).to_dict()
    skip = {"output_dir", "logging_dir", "accelerator_config"}  # temper: use_configured_state (its PartialState)
    diff = {k: (ours[k], bare.get(k)) for k in ours if k not in skip and ours[k] != bare.get(k)}
    assert not diff, f"bare TRL args differ from temper's: {diff}"
    return len(ours) - len(skip)


def launch(label: str, spec, metrics: Path, steps: int, warmup: int, marker: str) -> RunResult:
    from infra.launcher_local import run_job

    lines: list[str] = []
    t = time.perf_counter()
    with RankMonitor(metrics, warmup, steps, marker) as mon:
        status = run_job(spec, on_line=lines.append, cwd=str(REPO))
    wall = time.perf_counter() - t
    if status != 0:
        raise SystemExit(f"{label} failed with status {status}:\n" + "\n".join(lines[-40:]))
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "loss" in r]  # temper also logs the end-of-training summary (train_loss)
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), (label, [r["step"] for r in rows])
    print(f"  {label}: {wall:.1f} s wall, {len(rows)} steps", file=sys.stderr, flush=True)
    return RunResult(label, wall, rows, {r: kb / 1024 for r, kb in sorted(mon.peak_kb.items())},
                     mon.cpu_per_step())


def temper_run(root: Path, name: str, steps: int, warmup: int, **fields) -> RunResult:
    from temper.training.job import training_job

    path = write_config(root, name, max_steps=steps, **fields)
    out = root / name
    return launch(name, training_job(str(path), "grpo"), out / "metrics.jsonl", steps, warmup, "workloads.train")


def bare_run(root: Path, name: str, cfg, rows_path: Path, steps: int, warmup: int) -> RunResult:
    from infra.jobspec import JobSpec
    from temper.training.deepspeed import launch_env

    out = root / name
    out.mkdir(parents=True)
    args_path = out / "grpo_args.json"
    args_path.write_text(json.dumps(bare_args(cfg, str(out))))
    spec = JobSpec(name=name.replace("_", "-"), kind="train", env=launch_env(1), timeout_s=3600,
                   command=[sys.executable, str(REPO / "benchmarks" / "bare_trl_grpo.py"), "--model",
                            str(root / "tiny"), "--rows", str(rows_path), "--args", str(args_path),
                            "--metrics", str(out / "metrics.jsonl")])
    return launch(name, spec, out / "metrics.jsonl", steps, warmup, "bare_trl_grpo.py")


def stats(runs: list[RunResult], warmup: int) -> dict:
    """Medians over the post-warm-up steps of all runs of one kind."""
    step, interval, tps = [], [], []
    for r in runs:
        rows = r.rows
        for prev, row in zip(rows, rows[1:]):
            if row["step"] <= warmup:
                continue
            step.append(row["step_time_s"])
            if row.get("tokens_per_s"):
                tps.append(row["tokens_per_s"])
                interval.append((row["num_tokens"] - prev["num_tokens"]) / row["tokens_per_s"])
    cpu = [r.cpu_per_step for r in runs if r.cpu_per_step is not None]
    ranks = sorted({k for r in runs for k in r.peak_rss_mb})
    per_run = [statistics.median(row["step_time_s"] for row in r.rows if row["step"] > warmup) for r in runs]
    return {"step_s": statistics.median(step), "interval_s": statistics.median(interval),
            "best_run_step_s": min(per_run), "run_step_s": per_run,
            "tokens_per_s": statistics.median(tps), "cpu_per_step": statistics.median(cpu) if cpu else float("nan"),
            "rss": {k: max(r.peak_rss_mb.get(k, 0) for r in runs) for k in ranks},
            "wall_s": statistics.median(r.wall_s for r in runs), "n_steps": len(step), "runs": len(runs)}


def reward_cost(domains, rows_path: Path, calls: int = 200) -> dict[str, float]:
    """ms per reward call on one step's batch (16 completions), in this process: temper's DomainRewards
    (asyncio.run + one asyncio.to_thread per sample) vs the bare script's plain function."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bare_trl_grpo import number_reward

    from temper.training.rewards import DomainRewards

    rows = [json.loads(line) for line in rows_path.read_text().splitlines()[:GLOBAL_BATCH]]
    kw = dict(prompts=[r["prompt"] for r in rows], completions=[" 7 and more"] * len(rows),
              domain=[r["domain"] for r in rows], record=[r["record"] for r in rows])
    out = {}
    for name, fn in (("temper", DomainRewards(domains)), ("bare", number_reward)):
        fn(**kw)
        t = time.perf_counter()
        for _ in range(calls):
            fn(**kw)
        out[name] = (time.perf_counter() - t) / calls * 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=10, help="first steps left out of the medians")
    ap.add_argument("--rounds", type=int, default=5, help="pairs of (temper single, bare TRL) runs; ZeRO-3 runs "
                    "once before them and, with more than one round, once after")
    ap.add_argument("--quick", action="store_true", help="12 steps, 3 warm-up, 1 round")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (configs, metrics, rows)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup, args.rounds = 12, 3, 1

    t0 = time.perf_counter()
    root = embedded_workspace("temper-bench-train-")

    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.core.settings import get_settings
    from temper.training.config import load_config
    from temper.training.run import build_stream, load_domains
    from temper.training.tiny import init_tiny
    from transformers import AutoTokenizer

    get_settings.cache_clear()
    catalog = load_catalog(REPO / "domains")
    for name in DOMAINS:
        generate_domain_dataset(catalog[name])
    init_tiny(root / "tiny")

    # the rows temper's single run consumes, for the bare script; and its GRPOConfig values
    probe = load_config(write_config(root, "probe", max_steps=args.steps, deepspeed=False, world_size=1,
                                     per_device_batch_size=GLOBAL_BATCH))
    domains, frames, _, _ = load_domains(probe, get_settings())
    rows_path = root / "rows.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(root / "tiny")  # the rows as temper's run formats them (chat template)
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in build_stream(probe, domains, frames, tokenizer)))
    n_fields = check_same_args(probe, bare_args(probe, str(root / "probe")))
    reward_ms = reward_cost(domains, rows_path)

    single_fields = dict(deepspeed=False, world_size=1, per_device_batch_size=GLOBAL_BATCH)
    zero3_fields = dict(deepspeed=True, world_size=2, per_device_batch_size=GLOBAL_BATCH // 2)
    zero3 = [temper_run(root, "zero3_0", args.steps, args.warmup, **zero3_fields)]
    single, bare = [], []
    for i in range(args.rounds):
        pair = [lambda: single.append(temper_run(root, f"single_{i}", args.steps, args.warmup, **single_fields)),
                lambda: bare.append(bare_run(root, f"bare_{i}", probe, rows_path, args.steps, args.warmup))]
        for go in (pair if i % 2 == 0 else pair[::-1]):
            go()
    if args.rounds > 1:
        zero3.append(temper_run(root, "zero3_1", args.steps, args.warmup, **zero3_fields))

    z, s, b = stats(zero3, args.warmup), stats(single, args.warmup), stats(bare, args.warmup)
    import torch
    import transformers
    import trl

    print(f"tiny Llama (init_tiny), GRPO on {'+'.join(DOMAINS)}, global batch {GLOBAL_BATCH} completions "
          f"(4 prompts x 4), max_completion_length 8, beta 0.04; {args.steps} steps/run, medians over steps > "
          f"{args.warmup}; torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
          f"{os.cpu_count()} cores; total {time.perf_counter() - t0:.0f} s\n")

    def rss(st: dict) -> str:
        return ", ".join(f"r{k} {v:.0f}" for k, v in st["rss"].items())

    print("| run | runs x steps | step s (in-step) | step s (log-to-log) | tokens/s | CPU s/step (all ranks) | "
          "peak RSS MB per rank | job wall s |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for label, st in (("temper ZeRO-3, 2 ranks", z), ("temper single process, no DeepSpeed", s),
                      ("bare TRL GRPOTrainer, single process", b)):
        print(f"| {label} | {st['runs']} x {st['n_steps']} | {st['step_s']:.3f} | {st['interval_s']:.3f} | "
              f"{st['tokens_per_s']:.0f} | {st['cpu_per_step']:.3f} | {rss(st)} | {st['wall_s']:.0f} |")
    print()
    z_rss = max(z["rss"].values())
    s_rss = max(s["rss"].values())
    print("| comparison | step time (in-step) | step time (log-to-log) | tokens/s | CPU s/step | peak RSS per rank | "
          "job wall |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| ZeRO-3 2 ranks / single process | {z['step_s'] / s['step_s']:.2f}x | "
          f"{z['interval_s'] / s['interval_s']:.2f}x | {z['tokens_per_s'] / s['tokens_per_s']:.2f}x | "
          f"{z['cpu_per_step'] / s['cpu_per_step']:.2f}x | {z_rss / s_rss:.2f}x (max rank) | "
          f"{z['wall_s'] / s['wall_s']:.2f}x |")
    print(f"| temper single / bare TRL | {s['step_s'] / b['step_s']:.2f}x | {s['interval_s'] / b['interval_s']:.2f}x | "
          f"{s['tokens_per_s'] / b['tokens_per_s']:.2f}x | {s['cpu_per_step'] / b['cpu_per_step']:.2f}x | "
          f"{s_rss / max(b['rss'].values()):.2f}x | {s['wall_s'] / b['wall_s']:.2f}x |")
    print(f"| temper single / bare TRL, least-disturbed run of each | {s['best_run_step_s'] / b['best_run_step_s']:.2f}x "
          f"| | | | | |")
    print()
    print("per-run median step ms: " + "; ".join(
        f"{label} " + ", ".join(f"{x * 1000:.0f}" for x in st["run_step_s"])
        for label, st in (("ZeRO-3", z), ("temper single", s), ("bare TRL", b))))
    print(f"reward function per step (16 completions, measured in-process): temper DomainRewards "
          f"{reward_ms['temper']:.2f} ms, bare plain function {reward_ms['bare']:.2f} ms -> "
          f"{reward_ms['temper'] - reward_ms['bare']:.1f} ms = {(reward_ms['temper'] - reward_ms['bare']) / 1000 / b['step_s']:.0%} "
          f"of a bare step")
    print()
    over = s["interval_s"] / b["interval_s"]
    print(f"goal 'temper GRPO step within 1.1x of bare TRL': {over:.2f}x log-to-log, "
          f"{s['step_s'] / b['step_s']:.2f}x in-step, {s['cpu_per_step'] / b['cpu_per_step']:.2f}x CPU/step -> "
          f"{'MET' if over <= 1.1 else 'NOT MET'} (same {n_fields} GRPOConfig fields, same rows)")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
