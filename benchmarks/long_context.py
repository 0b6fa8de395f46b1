"""Long context, per prompt length: accuracy and effective context length, TTFT with and without the
prefix cache, and peak memory of a chunked prefill.

Sections (every ratio is against a baseline measured in the same run, on the same model):
1. Accuracy vs length on the three long-context domains (at most ``--per-cell`` items per length),
   through the eval job's own code, and the effective context length with its interval. The tiny
   model reads only the 448-token prompts (512 positions) and answers none: "not measurable" is the
   expected, honest result. ``--model DIR`` runs a real model folder instead (e.g. SmolLM2-135M built
   by `make realistic`; 8k tokens cost about a minute per prompt on 2 cores).
2. TTFT at each length: a request sharing a document of that length with an earlier one, prefix
   cache on vs off (median of ``--repeats``), on a random model built with enough positions.
3. Peak RSS growth of one prefill at each length, chunks of ``--chunk`` tokens, each in its own
   subprocess (benchmarks/rollout.py's probe), against the K/V the prompt must hold anyway. Goal (issue
   18): growth(8k) <= 1.2 x growth(1k) + K/V(8k); the overhead beyond the K/V is printed too.

Not here: short-request latency under long load (issue 18, item 3: open-loop arrivals, 5 repeats) is
benchmarks/mixed_load.py; benchmarks/rollout.py section 3 has the older closed-loop version.

Run: .venv/bin/python benchmarks/long_context.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LENGTHS = (1024, 2048, 4096, 8192)
DOMAINS = ("long_retrieval", "long_cross_file", "long_tool_history")


def accuracy_by_length(model_dir: str, per_cell: int) -> None:
    from temper.cli import main as temper
    from temper.registry.effective_context import effective_context
    from workloads.evaluate import evaluate_domains

    assert temper(["data", "generate", *[a for d in DOMAINS for a in ("--domain", d)]]) == 0
    print(f"\n1. accuracy by prompt length ({per_cell} items per length, model {model_dir})")
    for result in evaluate_domains(model_dir, list(DOMAINS), limit=5 * per_cell, max_new_tokens=12):
        ec = effective_context(list(zip(result.context_lengths, result.rewards)))
        cells = "  ".join(f"{n}: {a:.2f} [{lo:.2f}, {hi:.2f}]" for n, a, lo, hi in
                          zip(ec.lengths, ec.accuracy, ec.ci_low, ec.ci_high))
        print(f"  {result.domain:18s} {cells}  (too long for the model: {result.too_long})")
        print(f"  {'':18s} effective context: {ec.describe()}")


def ttft_by_length(model_dir: Path, repeats: int) -> list[tuple[int, float, float]]:
    from temper.rollout.config import EngineConfig, LaneConfig, PrefixCacheConfig
    from temper.rollout.decoding import SamplingParams
    from temper.rollout.engine import Engine

    params = SamplingParams(max_tokens=1, temperature=0.0)
    lanes = [LaneConfig(name="all", max_prompt_tokens=max(LENGTHS) + 64, prefill_chunk_tokens=256)]
    out = []
    for n in LENGTHS:
        doc = [5 + (i * 7) % 90 for i in range(n)]
        medians = {}
        for name, enabled in (("off", False), ("on", True)):
            e = Engine(EngineConfig(model_dir=model_dir, lanes=lanes, prefix_cache=PrefixCacheConfig(
                enabled=enabled, budget_bytes=1 << 30)))
            e.generate([doc + [6]], params)  # the first request: fills the cache when it is on
            medians[name] = statistics.median(e.generate([doc + [7 + k]], params)[0].ttft_s for k in range(repeats))
        out.append((n, medians["off"], medians["on"]))
    return out


def memory_by_length(model_dir: Path, chunk: int) -> list[tuple[int, float, float]]:
    out = []
    for n in LENGTHS:
        probe = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rollout.py"), "--memory-probe",
                                str(model_dir), str(n), str(chunk)], capture_output=True, text=True, check=True)
        result = json.loads(probe.stdout.strip().splitlines()[-1])
        out.append((n, result["peak_growth_kib"] / 1024, result["kv_kib"] / 1024))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 items per length, 3 TTFT repeats")
    ap.add_argument("--model", default=None, help="a model folder for section 1 (default: the tiny model)")
    ap.add_argument("--per-cell", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--chunk", type=int, default=64)
    args = ap.parse_args()
    per_cell, repeats = (2, 3) if args.quick else (args.per_cell, args.repeats)

    from benchmarks.workspace import embedded_workspace
    from temper.training.tiny import init_tiny

    root = embedded_workspace("temper-bench-long-")
    tiny = init_tiny(Path(tempfile.mkdtemp(dir=root)) / "tiny")
    accuracy_by_length(args.model or str(tiny), per_cell)

    # a random model with positions for the longest prompt: speeds and memory are real, answers are not
    wide = init_tiny(root / "wide", hidden=256, layers=4, heads=8, max_positions=max(LENGTHS) + 128)
    print(f"\n2. TTFT of a request sharing a document with an earlier one (median of {repeats}; 256x4 random model)")
    print("  tokens   no cache   prefix cache   speed-up")
    for n, off, on in ttft_by_length(wide, repeats):
        print(f"  {n:6d}   {off * 1000:7.1f} ms   {on * 1000:9.1f} ms   {off / on:6.1f}x")

    print(f"\n3. peak RSS growth of one prefill, chunks of {args.chunk} tokens (own subprocess each)")
    print("  tokens   growth       K/V alone    beyond the K/V")
    rows = memory_by_length(wide, args.chunk)
    for n, growth, kv in rows:
        print(f"  {n:6d}   {growth:6.1f} MiB   {kv:6.1f} MiB   {growth - kv:6.1f} MiB")
    (n0, g0, _), (n1, g1, kv1) = rows[0], rows[-1]
    bound = 1.2 * g0 + kv1
    print(f"  goal: growth({n1}) <= 1.2 x growth({n0}) + K/V({n1}) = {bound:.1f} MiB: "
          f"{'met' if g1 <= bound else 'NOT met'} ({g1:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
