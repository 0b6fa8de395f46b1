"""temper on one GPU: GRPO step time against bare TRL, engine decoding against ``generate``, training-phase MFU.

Run on a machine with one CUDA GPU (``benchmarks/gpu.sh`` does it, after the ``gpu``-marked tests):

    python benchmarks/gpu.py --out benchmarks/results/gpu.md [--steps 6] [--budget-s 330]

What it builds and runs (nothing is downloaded):
* a random ~0.72B Llama (hidden 2048, 16 layers, 32 query / 8 K-V heads, MLP 5632) with temper's own
  character tokenizer (``temper.training.tiny.init_tiny``), built on the GPU and saved in bf16;
* the demo's arithmetic + multiplication domains (their generators);
* GRPO runs of the same rows, 4 prompts x 4 generations x 128 new tokens a step, through the same local
  launcher: ``temper train grpo`` (TrainConfig with ``world_size: auto``, ``precision: auto``) with TRL's
  own generation and with ``grpo.generation: engine``; ``temper train grpo`` under DeepSpeed ZeRO-3 (one
  rank); and bare TRL ``GRPOTrainer`` (``benchmarks/bare_trl_grpo.py``: the same GRPOConfig fields as
  temper's, checked field by field, bf16). Step time is the median of steps 2.. (the first pays warm-up);
* decoding: the rollout engine (bf16, slot decode: CUDA graphs) against ``model.generate`` (bf16, same
  model, same prompts, sampling, EOS ignored so both produce exactly rows x 128 tokens), at batch 16 (4
  prompts x 4 samples, GRPO's shape) and 64; and greedy fp32 outputs of both, token for token.

MFU (training phase): 6 * N * T / (t_train * peak), with N the parameters, T the tokens the step trained
on (prompt + completion), t_train the step time minus its rollout, peak the GPU's dense bf16 peak
(``temper.training.device.PEAK_BF16_FLOPS``); see ``temper/training/throughput.py``.

Every section runs under one time budget (``--budget-s``); a section that does not fit is reported as
skipped, so the results file always says what ran.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from train import bare_args, check_same_args, launch, write_config  # noqa: E402 (benchmarks/train.py)
from workspace import embedded_workspace  # noqa: E402 (benchmarks/workspace.py)

DOMAINS = ["arithmetic", "multiplication"]
DEVICE = "cuda"
RUNS = ["temper_trainer", "bare", "temper_engine", "temper_zero3"]
MODEL = dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=5632, max_positions=2048)
NEW_TOKENS = 128
GRPO = dict(per_device_batch_size=16, num_generations=4, max_completion_length=NEW_TOKENS, temperature=1.0,
            beta=0.0, learning_rate=1e-6, deepspeed=False, world_size="auto", precision="auto")


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def environment() -> dict[str, str]:
    import torch

    out = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": os.environ.get("TEMPER_COMMIT") or _git("rev-parse", "--short", "HEAD") or "unknown",
           "python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda),
           "load_avg": " ".join(f"{x:.2f}" for x in os.getloadavg()), "cpus": str(os.cpu_count())}
    for name in ("transformers", "trl", "accelerate", "deepspeed"):
        try:
            out[name] = __import__(name).__version__
        except Exception as e:  # reported, not fatal: the section that needs it says so
            out[name] = f"missing ({type(e).__name__})"
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["gpu_memory_gib"] = f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f}"
    try:
        out["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out["driver"] = "unknown"
    return out


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# -- decoding ---------------------------------------------------------------------------------------------
def decode_section(model_dir: Path, prompts: list[str]) -> dict:
    """Engine vs generate tokens/s in bf16 at batch 16 and 64, and fp32 greedy parity."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from temper.rollout.config import EngineConfig, LaneConfig
    from temper.rollout.decoding import SamplingParams
    from temper.rollout.engine import Engine

    tok = AutoTokenizer.from_pretrained(model_dir)
    out: dict = {"rows": []}
    lanes = [LaneConfig(name="all", max_prompt_tokens=2048, max_queued=4096, max_running=256, prefill_chunk_tokens=2048)]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(DEVICE).eval()
    engine = Engine(EngineConfig(model_dir=model_dir, lanes=lanes, forward_token_budget=1 << 14, decode_slots=128),
                    model=model, tokenizer=tok)
    for batch in (16, 64):
        groups = batch // 4
        chosen = (prompts * 64)[:groups]
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, n=4, ignore_eos=True, seed=0)

        def run_engine() -> int:
            results = engine.generate(chosen, params)
            return sum(len(s.token_ids) for r in results for s in r.samples)

        ids = tok(chosen, return_tensors="pt", padding=True, padding_side="left").to(DEVICE)
        gc = GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=True, temperature=1.0,
                              num_return_sequences=4, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)

        def run_generate() -> int:
            with torch.no_grad():
                seq = model.generate(**ids, generation_config=gc)
            return (seq.shape[1] - ids["input_ids"].shape[1]) * seq.shape[0]

        sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
        timings = {}
        for label, fn in (("engine", run_engine), ("generate", run_generate)):
            fn()  # warm-up: CUDA graphs captured, kernels chosen
            rates = []
            for _ in range(3):
                sync()
                t = time.perf_counter()
                n = fn()
                sync()
                rates.append(n / (time.perf_counter() - t))
            timings[label] = rates
        e, g = statistics.median(timings["engine"]), statistics.median(timings["generate"])
        out["rows"].append({"batch": batch, "engine_tps": e, "generate_tps": g, "ratio": e / g,
                            "ratio_range": (min(timings["engine"]) / max(timings["generate"]),
                                            max(timings["engine"]) / min(timings["generate"]))})
    out["engine_stats"] = {k: v for k, v in engine.stats().items() if k in ("slot_decode", "forwards", "steps")}
    del engine, model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()

    # greedy fp32, token for token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEVICE).eval()
    engine = Engine(EngineConfig(model_dir=model_dir, lanes=lanes), model=model, tokenizer=tok)
    greedy = engine.generate(prompts[:8], SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    same = 0
    for prompt, result in zip(prompts[:8], greedy):
        ids = tok(prompt, return_tensors="pt").input_ids.to(DEVICE)
        gc = GenerationConfig(max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
        with torch.no_grad():
            ref = model.generate(ids, generation_config=gc)[0, ids.shape[1]:].tolist()
        same += result.samples[0].token_ids == ref
    out["greedy_fp32_identical"] = (same, len(greedy))
    del engine, model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return out


# -- GRPO -------------------------------------------------------------------------------------------------
def probe_rows(root: Path, steps: int):
    """The rows temper's GRPO run consumes (for the bare script and the decoding prompts) and its config."""
    from temper.core.settings import get_settings
    from temper.training.config import load_config
    from temper.training.run import build_stream, load_domains
    from transformers import AutoTokenizer

    probe = load_config(write_config(root, "probe", max_steps=steps, **GRPO, base_model=str(root / "model")))
    domains, frames, _, _ = load_domains(probe, get_settings())
    rows_path = root / "rows.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(root / "model")  # the rows as temper's run formats them
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in build_stream(probe, domains, frames, tokenizer)))
    return probe, rows_path


def grpo_runs(root: Path, probe, rows_path: Path, steps: int, budget: Budget, sections: dict) -> dict:
    """temper (TRL generation, engine generation, ZeRO-3) and bare TRL on the same rows; medians of steps 2..."""
    from temper.training.device import rank_placement
    from temper.training.job import training_job

    placement = rank_placement(probe.precision)
    kwargs = bare_args(probe, str(root / "probe"), cuda=placement.cuda, bf16=placement.bf16)
    sections["same_fields"] = check_same_args(probe, kwargs)
    out = {}
    kinds = [("temper_trainer", {}), ("bare", None), ("temper_engine", {"generation": "engine"}),
             ("temper_zero3", {"deepspeed": True})]
    for name, extra in kinds:
        if name not in RUNS:
            out[name] = {"skipped": "not asked for (--runs)"}
            continue
        if budget.left() < 60:
            out[name] = {"skipped": f"time budget ({budget.left():.0f} s left)"}
            continue
        try:
            if extra is None:
                out[name] = bare_run(root, probe, kwargs, rows_path, steps)
            else:
                path = write_config(root, name, max_steps=steps, **{**GRPO, **extra}, base_model=str(root / "model"))
                out[name] = summarize(launch(name, training_job(str(path), "grpo"), root / name / "metrics.jsonl",
                                             steps, 1, "workloads.train").rows)
        except BaseException as e:  # SystemExit from launch carries the job's last lines
            out[name] = {"failed": f"{type(e).__name__}: {e}"[-3000:]}
        print(f"gpu bench: {name}: {json.dumps(out[name])[:400]}", flush=True)
    return out


def bare_run(root: Path, probe, kwargs: dict, rows_path: Path, steps: int) -> dict:
    from infra.jobspec import JobSpec
    from temper.training.deepspeed import launch_env

    out = root / "bare"
    out.mkdir(parents=True, exist_ok=True)
    args_path = out / "grpo_args.json"
    args_path.write_text(json.dumps({**kwargs, "output_dir": str(out)}))
    spec = JobSpec(name="bare", kind="train", env=launch_env(1), timeout_s=900,
                   command=[sys.executable, str(REPO / "benchmarks" / "bare_trl_grpo.py"), "--model", str(root / "model"),
                            "--rows", str(rows_path), "--args", str(args_path), "--metrics", str(out / "metrics.jsonl")])
    return summarize(launch("bare", spec, out / "metrics.jsonl", steps, 1, "bare_trl_grpo.py").rows)


def summarize(rows: list[dict]) -> dict:
    later = [r for r in rows if r["step"] >= 2]
    med = lambda key: statistics.median(r[key] for r in later) if later and all(key in r for r in later) else None  # noqa: E731
    return {"steps": len(rows), "step_s": med("step_time_s"), "step_s_each": [round(r["step_time_s"], 3) for r in rows],
            "rollout_s": med("rollout_s"), "train_phase_s": med("train_phase_s"), "mfu": med("mfu"),
            "mfu_every_step": all("mfu" in r for r in rows),
            "gen_tokens_per_s": (statistics.median(r["completions/mean_length"] * GRPO["per_device_batch_size"] / r["rollout_s"]
                                                   for r in later) if later and all("rollout_s" in r for r in later) else None)}


def parameters(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            total += sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
    return total


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- report -----------------------------------------------------------------------------------------------
def report(env: dict, sections: dict) -> str:
    lines = ["# temper on one GPU", "",
             f"Measured {env['date']} at commit {env['commit']} by `benchmarks/gpu.py` (run by `benchmarks/gpu.sh`).", "",
             "| what | value |", "|---|---|"]
    for key in ("gpu", "gpu_memory_gib", "driver", "cuda", "torch", "transformers", "trl", "accelerate", "deepspeed",
                "python", "cpus", "load_avg"):
        lines.append(f"| {key} | {env.get(key, '?')} |")
    lines += ["", f"Model: random Llama {sections.get('params', 0) / 1e9:.2f}B parameters ({MODEL}), temper's character "
              f"tokenizer, saved in bf16. GRPO: {GRPO['per_device_batch_size'] // GRPO['num_generations']} prompts x "
              f"{GRPO['num_generations']} generations x {NEW_TOKENS} new tokens a step on {'+'.join(DOMAINS)}, "
              "lr 1e-6, beta 0, one rank, precision auto (bf16).", ""]
    goals = []
    grpo = sections.get("grpo", {})
    if grpo:
        lines += ["## GRPO step (median of steps 2..)", "",
                  "| run | step s | rollout s | training phase s | training-phase MFU | generated tokens/s | per step |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        labels = {"bare": "bare TRL GRPOTrainer, bf16, TRL generate",
                  "temper_trainer": "`temper train grpo`, generation trainer",
                  "temper_engine": "`temper train grpo`, generation engine",
                  "temper_zero3": "`temper train grpo`, DeepSpeed ZeRO-3 (1 rank), generation trainer"}
        for key, label in labels.items():
            r = grpo.get(key, {})
            if "step_s" not in r or r["step_s"] is None:
                lines.append(f"| {label} | {r.get('skipped') or 'FAILED (below)' if r else 'not run'} | | | | | |")
                continue
            fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
            lines.append(f"| {label} | {r['step_s']:.3f} | {fmt(r['rollout_s'], '.3f')} | {fmt(r['train_phase_s'], '.3f')} "
                         f"| {fmt(r['mfu'] and 100 * r['mfu'], '.1f')}{'%' if r['mfu'] else ''} "
                         f"| {fmt(r['gen_tokens_per_s'], '.0f')} | {r['step_s_each']} |")
        bare = grpo.get("bare", {}).get("step_s")
        for key, limit, what in (("temper_trainer", 1.1, "temper (TRL generation) / bare TRL"),
                                 ("temper_engine", 0.6, "temper (engine rollouts) / bare TRL")):
            mine = grpo.get(key, {}).get("step_s")
            if bare and mine:
                ratio = mine / bare
                goals.append(f"| {what} step time <= {limit}x | {ratio:.2f}x | {'MET' if ratio <= limit else 'MISSED'} |")
            else:
                goals.append(f"| {what} step time <= {limit}x | not measured | MISSED |")
        mfu_ok = all(grpo.get(k, {}).get("mfu_every_step") for k in ("temper_trainer", "temper_engine"))
        goals.append(f"| training-phase MFU in every step's metrics (and progress line) | "
                     f"{'yes' if mfu_ok else 'no'} | {'MET' if mfu_ok else 'MISSED'} |")
        lines.append("")
        failed = {k: v["failed"] for k, v in grpo.items() if "failed" in v}
        for k, v in failed.items():
            lines += [f"{k} failed:", "", "```", v, "```", ""]
        if "same_fields" in sections:
            lines += [f"temper's and the bare run's GRPOConfig agree on {sections['same_fields']} fields.", ""]
    dec = sections.get("decode")
    if dec and "rows" in dec:
        lines += ["## Decoding: engine vs `model.generate` (bf16, sampling, EOS ignored, 128 new tokens)", "",
                  "| batch (prompts x 4 samples) | engine tokens/s | generate tokens/s | ratio (median of 3) | ratio range |",
                  "|---:|---:|---:|---:|---|"]
        for r in dec["rows"]:
            lo, hi = r["ratio_range"]
            lines.append(f"| {r['batch']} | {r['engine_tps']:.0f} | {r['generate_tps']:.0f} | {r['ratio']:.2f}x | "
                         f"{lo:.2f}-{hi:.2f}x |")
        same, total = dec["greedy_fp32_identical"]
        lines += ["", f"Greedy fp32, 64 tokens: {same} of {total} prompts identical to `generate` token for token.",
                  f"Engine counters: {dec.get('engine_stats')}", ""]
        r16 = next(r for r in dec["rows"] if r["batch"] == 16)
        goals.append(f"| engine decoding >= 2x generate tokens/s at batch 16 | {r16['ratio']:.2f}x | "
                     f"{'MET' if r16['ratio'] >= 2 else 'MISSED'} |")
        goals.append(f"| greedy fp32 outputs identical to generate | {same}/{total} | "
                     f"{'MET' if same == total else 'MISSED'} |")
    elif dec:
        lines += ["## Decoding", "", "```", dec.get("failed", dec.get("skipped", "?")), "```", ""]
        goals.append("| engine decoding >= 2x generate at batch 16 | not measured | MISSED |")
    if sections.get("tests"):
        lines += ["## GPU tests (`pytest -m gpu tests/gpu`)", "", "```", sections["tests"], "```", ""]
    head = ["## Goals", "", "| goal | measured | verdict |", "|---|---|---|", *goals, ""]
    at = lines.index("## GRPO step (median of steps 2..)") if "## GRPO step (median of steps 2..)" in lines else len(lines)
    lines[at:at] = head
    lines += [f"Total wall time of the check: {sections.get('wall_s', 0):.0f} s.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu.md"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=330, help="stop starting sections after this many seconds")
    ap.add_argument("--tests-log", default=None, help="the gpu tests' output, quoted in the report")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, 2 steps, 8 tokens: checks this script "
                    "itself on a machine without a GPU (its numbers mean nothing)")
    ap.add_argument("--runs", default=",".join(RUNS), help="GRPO runs to make, of " + ",".join(RUNS))
    args = ap.parse_args()
    RUNS[:] = args.runs.split(",")
    global DEVICE, NEW_TOKENS
    if args.smoke:
        DEVICE, NEW_TOKENS, args.steps = "cpu", 8, 3
        MODEL.clear()
        MODEL.update(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, max_positions=512)
        GRPO.update(max_completion_length=NEW_TOKENS, world_size=1)
    t0 = time.perf_counter()
    budget = Budget(args.budget_s)
    root = embedded_workspace("temper-bench-gpu-")

    import torch

    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.training.tiny import init_tiny

    if not torch.cuda.is_available() and not args.smoke:
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU (--smoke checks the script on CPU)")
    env = environment()
    sections: dict = {}
    if args.tests_log and Path(args.tests_log).exists():
        sections["tests"] = "\n".join(Path(args.tests_log).read_text().splitlines()[-15:])
    get_settings.cache_clear()
    catalog = load_catalog(REPO / "domains")
    for name in DOMAINS:
        generate_domain_dataset(catalog[name])
    init_tiny(root / "model", **MODEL, device=DEVICE, dtype="bfloat16")
    sections["params"] = parameters(root / "model")
    print(f"gpu bench: model {sections['params'] / 1e9:.2f}B in {time.perf_counter() - t0:.0f} s", flush=True)
    probe, rows_path = probe_rows(root, args.steps)
    prompts = [json.loads(line)["prompt"] for line in rows_path.read_text().splitlines()[::4][:16]]
    try:
        sections["decode"] = decode_section(root / "model", prompts)
    except Exception:
        sections["decode"] = {"failed": traceback.format_exc()[-3000:]}
    print(f"gpu bench: decoding {json.dumps(sections['decode'])[:600]}", flush=True)
    try:
        sections["grpo"] = grpo_runs(root, probe, rows_path, args.steps, budget, sections)
    except Exception:
        sections["grpo"] = {"setup": {"failed": traceback.format_exc()[-3000:]}}
    sections["wall_s"] = time.perf_counter() - t0
    text = report(env, sections)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
