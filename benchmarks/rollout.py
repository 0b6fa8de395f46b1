"""Rollout engine: prefix cache, chunked prefill, lanes and the fast profile, each against its baseline.

Sections (every ratio is against a baseline measured in the same run, on the same model):
1. GRPO group rollouts, G=8: the engine (prompt prefilled once, group decoded as one batch, shared
   prefix from the cache) vs naive per-sample ``model.generate`` (goal >= 3x tokens/s).
2. TTFT of requests sharing a long document prefix: prefix cache on vs off.
3. Short-request p99 latency while long-context requests run (closed loop): with the default lanes
   (mixed batches: long chunks ride in the short requests' forwards) and, for contrast, one
   unchunked FIFO lane; both against short requests alone. The open-loop measurement of issue 18
   (both goals, 5 repeats) is benchmarks/mixed_load.py.
4. Peak memory (RSS high-water mark over the loaded model, own subprocess each) of one long prompt,
   prefilled in chunks vs in one forward.
5. Fast profile with a draft model (speculative decoding in the engine's loop) vs standard, greedy, at
   identical output (the parity gate), with a layer-truncated draft and an int8 copy of the target.

Models are random (``init_tiny``) and built locally: speeds are real, "acceptance" of a draft is only
what a random network gives. Run: .venv/bin/python benchmarks/rollout.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ROWS: list[tuple[str, str, str, str, str]] = []


def row(section: str, baseline: str, variant: str, ratio: float, goal: str = "") -> None:
    ROWS.append((section, baseline, variant, f"{ratio:.2f}x", goal))
    print(f"  {section}: {baseline} -> {variant} = {ratio:.2f}x {goal}", flush=True)


def engine_for(model_dir, **kw):
    from temper.rollout.config import EngineConfig
    from temper.rollout.engine import Engine

    return Engine(EngineConfig(model_dir=model_dir, **kw))


def bench_groups(model_dir: Path, prompts: list[str], g: int, max_tokens: int) -> None:
    import torch
    from transformers import GenerationConfig

    from temper.rollout.decoding import SamplingParams

    e = engine_for(model_dir)
    model, tok = e.model, e.tokenizer
    gc = GenerationConfig(max_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                          pad_token_id=tok.pad_token_id, eos_token_id=None)
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, n=g, ignore_eos=True, seed=0)
    e.generate(prompts[:1], params.model_copy(update={"n": 2}))  # warm-up
    with torch.no_grad():
        model.generate(tok(prompts[0], return_tensors="pt").input_ids, generation_config=gc)
        t0 = time.perf_counter()
        naive_tokens = 0
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            for _ in range(g):
                naive_tokens += model.generate(ids, generation_config=gc).shape[1] - ids.shape[1]
        naive_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = e.generate(prompts, params)
    engine_s = time.perf_counter() - t0
    engine_tokens = sum(len(t) for r in out for t in r.token_ids)
    naive_tps, engine_tps = naive_tokens / naive_s, engine_tokens / engine_s
    print(f"  groups: naive {naive_tps:.0f} tok/s ({naive_tokens} tokens), engine {engine_tps:.0f} tok/s "
          f"({engine_tokens} tokens)")
    row(f"GRPO G={g} tokens/s", f"per-sample generate {naive_tps:.0f}/s", f"engine n={g} {engine_tps:.0f}/s",
        engine_tps / naive_tps, "goal >= 3x: " + ("met" if engine_tps / naive_tps >= 3 else "NOT met"))


def bench_ttft(model_dir: Path, doc: str, questions: list[str]) -> None:
    from temper.rollout.config import PrefixCacheConfig
    from temper.rollout.decoding import SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0.0)
    results = {}
    for name, enabled in (("off", False), ("on", True)):
        e = engine_for(model_dir, prefix_cache=PrefixCacheConfig(enabled=enabled))
        e.generate([doc + "warm-up"], params)  # first request: fills the cache when it is on
        ttfts = [e.generate([doc + q], params)[0].ttft_s for q in questions]
        results[name] = statistics.median(ttfts)
    n = len(e.encode(doc))
    row(f"TTFT, {n}-token shared prefix", f"no cache {results['off'] * 1000:.1f} ms",
        f"prefix cache {results['on'] * 1000:.1f} ms", results["off"] / results["on"], "(speed-up)")


def _short_latencies(e, prompts: list[str], max_tokens: int, concurrency: int) -> list[float]:
    from temper.rollout.decoding import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    lat: list[float] = []
    lock = threading.Lock()
    todo = list(prompts)

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                p = todo.pop()
            t0 = time.perf_counter()
            e.generate([p], params, timeout_s=600)
            with lock:
                lat.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]


def bench_lanes(model_dir: Path, short_prompts: list[str], long_prompt: list[int], max_tokens: int) -> None:
    from temper.rollout.config import LaneConfig, PrefixCacheConfig, default_lanes
    from temper.rollout.decoding import SamplingParams

    no_cache = PrefixCacheConfig(enabled=False)  # every long request is a fresh long prefill
    setups = {
        "default lanes": dict(lanes=default_lanes()),  # short <= 2048 tokens; long: 64-token chunks per forward
        "one FIFO lane, unchunked": dict(lanes=[LaneConfig(name="all", max_prompt_tokens=8192, max_running=5,
                                                           prefill_chunk_tokens=8192)], mixed_batches=False),
    }
    for name, kw in setups.items():
        e = engine_for(model_dir, prefix_cache=no_cache, **kw).start()
        alone_lat: list[float] = []
        loaded_lat: list[float] = []
        long_done: list[int] = []
        try:
            _short_latencies(e, short_prompts[:4], max_tokens, 4)  # warm-up
            rounds = 4
            parts = [short_prompts[i::rounds] for i in range(rounds)]
            for part in parts:  # interleaved rounds, so drift in the machine's load hits both conditions
                alone_lat += _short_latencies(e, part, max_tokens, 4)
                stop = threading.Event()

                def long_load():
                    while not stop.is_set():
                        e.generate([long_prompt], SamplingParams(max_tokens=4, temperature=0.0), timeout_s=600)
                        long_done.append(1)

                bg = threading.Thread(target=long_load)
                bg.start()
                time.sleep(0.05)
                loaded_lat += _short_latencies(e, part, max_tokens, 4)
                stop.set()
                bg.join()
        finally:
            e.close()
        alone, loaded = _p99(alone_lat), _p99(loaded_lat)
        p50 = statistics.median(loaded_lat) / statistics.median(alone_lat)
        goal = "(contrast)"
        if name == "default lanes":
            goal = "goal <= 1.25x: " + ("met" if loaded / alone <= 1.25 else "NOT met")
        row(f"short p99 + {len(long_prompt)}-token load, {name}", f"short only {alone * 1000:.0f} ms",
            f"with long load {loaded * 1000:.0f} ms (p50 ratio {p50:.2f}x, {len(long_done)} long done)",
            loaded / alone, goal)


def _status_kib(key: str) -> int:
    import re

    return int(re.search(key + r":\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def memory_probe(model_dir: str, prompt_tokens: int, chunk: int) -> None:
    """Subprocess body: RSS high-water growth of one long prefill over the loaded, warmed-up model
    (the high-water mark is reset first through /proc/self/clear_refs, so loading does not mask it)."""
    from temper.rollout.config import LaneConfig, PrefixCacheConfig
    from temper.rollout.decoding import SamplingParams

    e = engine_for(Path(model_dir), prefix_cache=PrefixCacheConfig(enabled=False),
                   lanes=[LaneConfig(name="all", max_prompt_tokens=prompt_tokens, prefill_chunk_tokens=chunk)])
    params = SamplingParams(max_tokens=1, temperature=0.0)
    e.generate([[5 + i % 90 for i in range(32)]], params)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    e.generate([[5 + i % 90 for i in range(prompt_tokens)]], params)
    c = e.model.config
    head_dim = c.hidden_size // c.num_attention_heads
    kv_kib = prompt_tokens * c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * 4 / 1024  # float32 K+V
    print(json.dumps({"peak_growth_kib": _status_kib("VmHWM") - before, "kv_kib": kv_kib}))


def bench_memory(model_dir: Path, prompt_tokens: int, chunk: int) -> None:
    growth, kv = {}, 0.0
    for name, c in (("unchunked", prompt_tokens), ("chunked", chunk)):
        out = subprocess.run([sys.executable, __file__, "--memory-probe", str(model_dir), str(prompt_tokens), str(c)],
                             capture_output=True, text=True, check=True)
        probe = json.loads(out.stdout.strip().splitlines()[-1])
        growth[name], kv = probe["peak_growth_kib"] / 1024, probe["kv_kib"] / 1024
    row(f"peak RSS growth, {prompt_tokens}-token prefill", f"one forward {growth['unchunked']:.0f} MiB",
        f"chunks of {chunk} {growth['chunked']:.0f} MiB (the K/V alone is {kv:.0f} MiB)",
        growth["unchunked"] / max(growth["chunked"], 1e-3), "(reduction)")


def bench_fast(root: Path, prompts: list[str], max_tokens: int, hidden: int, layers: int) -> None:
    from temper.rollout.config import EngineConfig, LaneConfig, SpeculativeConfig
    from temper.rollout.engine import Engine
    from temper.rollout.draft_model import derive_layer_draft
    from temper.rollout.parity import parity_gate
    from temper.training.tiny import init_tiny

    target = init_tiny(root / "fast-target", hidden=hidden, layers=layers, heads=8, max_positions=1024, seed=1)
    layer_draft = derive_layer_draft(target, root / "fast-draft", keep_layers=max(1, layers // 4))
    lanes = [LaneConfig(name="all", max_prompt_tokens=1024)]
    standard = Engine(EngineConfig(model_dir=target, lanes=lanes))
    drafts = {f"first {max(1, layers // 4)} of {layers} layers": SpeculativeConfig(method="draft_model", draft_dir=layer_draft),
              "int8 copy of the target": SpeculativeConfig(method="draft_model", quantize_draft=True)}
    for name, spec in drafts.items():
        spec = spec.model_copy(update={"num_assistant_tokens": 5})
        fast = Engine(EngineConfig(model_dir=target, lanes=lanes, profile="fast", speculative=spec),
                      model=standard.model, tokenizer=standard.tokenizer)
        rep = parity_gate(standard, fast, prompts, max_tokens=max_tokens)
        agree = _draft_agreement(standard, fast.decoder.draft, prompts, max_tokens)
        row(f"fast profile, draft = {name}", f"standard {rep.standard_s:.2f} s",
            f"fast {rep.fast_s:.2f} s, parity {'passed' if rep.passed else 'FAILED'}, "
            f"draft agrees on {agree:.0%} of tokens", rep.speedup,
            f"({hidden}x{layers} target, {rep.tokens} tokens)")


def _draft_agreement(standard, draft, prompts: list[str], max_tokens: int) -> float:
    """Teacher-forced share of positions where the draft's argmax equals the target's (acceptance proxy)."""
    import torch

    from temper.rollout.decoding import SamplingParams

    out = standard.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    same = total = 0
    with torch.no_grad():
        for p, r in zip(prompts, out):
            ids = torch.tensor([standard.encode(p) + r.token_ids[0]])
            a = standard.model(ids).logits.argmax(-1)[0, -max_tokens:]
            b = draft(ids).logits.argmax(-1)[0, -max_tokens:]
            same += int((a == b).sum())
            total += a.numel()
    return same / total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run, not the reported numbers)")
    ap.add_argument("--memory-probe", nargs=3, metavar=("MODEL", "TOKENS", "CHUNK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    if args.memory_probe:
        memory_probe(args.memory_probe[0], int(args.memory_probe[1]), int(args.memory_probe[2]))
        return 0
    from temper.training.tiny import init_tiny

    q = args.quick
    import os

    print(f"load average before: {os.getloadavg()[0]:.1f} (2 cores; other jobs share them)", flush=True)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        model = init_tiny(root / "bench", hidden=128, layers=4, heads=4, max_positions=8192, seed=0)
        system = "system: you are a careful math tutor. Think step by step, then give the answer.\n"
        doc = system + "document: " + " ".join(f"fact {i}: {i} squared is {i * i}." for i in range(60)) + "\n"
        print("1. GRPO groups", flush=True)
        bench_groups(model, [doc + f"user: what is {i} squared?\nassistant: " for i in range(2 if q else 4)],
                     g=8, max_tokens=16 if q else 32)
        print("2. TTFT with a shared prefix", flush=True)
        bench_ttft(model, doc, [f"user: what is {i} squared?\nassistant: " for i in range(4 if q else 8)])
        print("3. short p99 under long-context load", flush=True)
        shorts = [f"user: what is {i} + {i + 7}?\nassistant: " for i in range(12 if q else 80)]
        bench_lanes(model, shorts, [5 + i % 90 for i in range(1500 if q else 4000)], max_tokens=16)
        print("4. peak memory of a long prefill", flush=True)
        bench_memory(model, 2048 if q else 8000, 256)
        print("5. fast profile", flush=True)
        bench_fast(root, [f"user: what is {i} * {i + 3}?\nassistant: " for i in range(2 if q else 4)],
                   max_tokens=16 if q else 32, hidden=256 if q else 512, layers=8)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    widths = [max(len(r[i]) for r in ROWS + [("measure", "baseline", "variant", "ratio", "goal")]) for i in range(5)]
    line = " | ".join(h.ljust(w) for h, w in zip(("measure", "baseline", "variant", "ratio", "goal"), widths))
    print("\n" + line + "\n" + "-" * len(line))
    for r in ROWS:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
