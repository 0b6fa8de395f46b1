"""The fast profile (prompt lookup, ``temper/rollout/lookup.py``, or with ``--draft`` a draft model on the same
loop, ``draft_model.py``) against the standard profile, same prompts, same run (issue 31): output tokens/s, time
to first token, acceptance rate and tokens per target forward, per domain family, at batch 1 and batch 8, and
whether the greedy outputs are identical.

Families: each is a catalog domain's eval prompts as its eval renders them (``Domain.render_prompt``):
long_retrieval, long_cross_file, long_tool_history, extraction (invoice_extraction), code (humaneval),
arithmetic; chat is a set of open questions. Models: the tiny random model always (overhead-bound: its
forward is a fraction of a millisecond, so Python per step dominates; said separately), and SmolLM2-135M-
Instruct when `make realistic` installed it (prompts through its chat template).

Batch 1: the prompts one after another; tokens/s = tokens / summed latency; TTFT = the median request's.
Batch 8: 8 prompts submitted together; tokens/s = tokens / wall. The standard profile runs its default
(mixed batches: the 8 requests' decode rows in one forward); the fast profile too, each request's verify
(its last token and its drafts) being its segment of that one forward. Each repeat runs standard and fast
back to back in alternating order; the ratio is per repeat, reported as median and [min, max].

Run: PYTHONPATH=. .venv/bin/python benchmarks/fast_profile.py [--repeats 3] [--max-tokens 64]
     [--models tiny,smollm2] [--draft lookup|int8|layers:N] [--out benchmarks/results/fast_profile.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from temper.data.catalog import load_domain
from temper.data.generators import generate
from temper.rollout.config import EngineConfig, LaneConfig, SpeculativeConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine
from temper.training.tiny import init_tiny

REPO = Path(__file__).resolve().parents[1]
FAMILIES = {"long_retrieval": "long_retrieval", "long_cross_file": "long_cross_file",
            "long_tool_history": "long_tool_history", "extraction": "invoice_extraction", "code": "humaneval",
            "arithmetic": "arithmetic", "chat": None}
CHAT = ["Why is the sky blue? Answer in two sentences.", "Give three tips for writing clear emails.",
        "What is the difference between a list and a tuple in Python?", "Describe a good breakfast.",
        "Explain what a prime number is to a child.", "Name some uses of copper.",
        "How do vaccines work, briefly?", "Suggest a name for a small bakery and say why."]
COPY_HEAVY = {"long_retrieval", "long_cross_file", "long_tool_history", "extraction", "code"}
LANES = [LaneConfig(name="all", max_prompt_tokens=1 << 20, max_running=8, prefill_chunk_tokens=512)]


def family_prompts(family: str, rows: int) -> list[str]:
    if FAMILIES[family] is None:
        return CHAT[:rows]
    d = load_domain(REPO / "domains" / f"{FAMILIES[family]}.yaml")
    frame = generate(d.dataset.generator, max(rows, min(d.dataset.rows, 16)), d.dataset.seed, d.split.eval_fraction,
                     d.dataset.generator_params)
    return [d.render_prompt(rec) for rec in frame.to_dict("records")][:rows]


def model_dirs(names: list[str], root: Path) -> dict[str, Path]:
    out = {}
    if "tiny" in names:
        out["tiny random (128x4)"] = init_tiny(root / "tiny", hidden=128, layers=4, max_positions=16384, seed=0)
    if "smollm2" in names:
        from temper.training.gguf_base import import_gguf, packaged_gguf
        try:
            out["SmolLM2-135M-Instruct"] = import_gguf(packaged_gguf(), root / "smollm2")
        except Exception as e:  # not installed: say so in the results
            print(f"SmolLM2 skipped: {e}", file=sys.stderr)
    return out


def draft_fields(draft: str, target: Path, root: Path) -> dict:
    """The fast profile's drafts: ``lookup`` (prompt lookup), ``int8`` (an int8 copy of the target as draft model)
    or ``layers:N`` (the target's first N decoder layers as draft model)."""
    if draft == "lookup":
        return {}
    if draft == "int8":
        return {"method": "draft_model", "quantize_draft": True}
    if draft.startswith("layers:"):
        from temper.rollout.draft_model import derive_layer_draft

        folder = derive_layer_draft(target, root / f"{target.name}-draft", keep_layers=int(draft.split(":")[1]))
        return {"method": "draft_model", "draft_dir": folder}
    raise SystemExit(f"--draft {draft!r}: expected lookup, int8 or layers:N")


def draft_share(fast: Engine) -> str:
    """A draft model's decode forward over the time the target emits one token in the latest forwards (the cost
    the draft length weighs, ``DraftModelDecoder._draft_cost``); "-" for prompt lookup."""
    step = getattr(fast.decoder, "draft_step_s", None)
    rate = fast.decoder.cost.tokens_per_s
    return f"{step * rate:.2f}" if step and rate else "-"


def encode(engine: Engine, text: str, chat: bool) -> list[int]:
    if chat:
        return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)
    return engine.encode(text)


def measure(engine: Engine, prompts: list[list[int]], batch: int, params: SamplingParams) -> dict:
    """Tokens/s, median TTFT and the outputs of one profile over the prompts; the lookup counters' change."""
    before = dict(getattr(engine.decoder, "stats", {}))
    outputs, ttfts, tokens, busy = [], [], 0, 0.0
    groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    for group in groups:
        t = time.perf_counter()
        results = engine.generate(group, params)
        busy += time.perf_counter() - t
        for r in results:
            assert r.error is None, r.error
            outputs.append(r.samples[0].token_ids)
            ttfts.append(r.ttft_s)
            tokens += len(r.samples[0].token_ids)
    stats = {k: v - before.get(k, 0) for k, v in getattr(engine.decoder, "stats", {}).items()}
    return {"tok_s": tokens / busy, "ttft": statistics.median(ttfts), "outputs": outputs, "stats": stats}


def run(args) -> str:
    torch.set_num_threads(args.threads)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, folder in model_dirs(args.models.split(","), Path(tmp)).items():
            standard = Engine(EngineConfig(model_dir=folder, lanes=LANES))
            spec = SpeculativeConfig(max_draft_tokens=args.max_draft, num_assistant_tokens=min(5, args.max_draft),
                                     **draft_fields(args.draft, folder, Path(tmp)))
            fast = Engine(EngineConfig(model_dir=folder, lanes=LANES, profile="fast", speculative=spec),
                          model=standard.model, tokenizer=standard.tokenizer)
            chat = label.startswith("SmolLM2")
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
            lines += [f"\n## {label}\n", "| family | batch | prompt tokens (median) | standard tok/s | fast tok/s | "
                      "speed-up median [min, max] | TTFT fast / standard | acceptance | tokens per forward | "
                      "identical | draft forward / target token |", "|---|---|---|---|---|---|---|---|---|---|---|"]
            for family in args.families.split(","):
                texts = family_prompts(family, 8)
                prompts = [encode(standard, t, chat) for t in texts]
                prompts = [p[-(standard.context - args.max_tokens - 1):] for p in prompts]
                standard.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0))  # warm-up
                fast.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0))
                for batch, subset in ((1, prompts[:args.batch1_prompts]), (8, prompts)):
                    ratios, ttft_ratios, s_rates, f_rates, stats, same = [], [], [], [], [], True
                    for rep in range(args.repeats):
                        for eng in (standard.prefix_cache, fast.prefix_cache):
                            eng.clear()  # every repeat prefills its prompts: no profile reads the other's cache
                        order = (standard, fast) if rep % 2 == 0 else (fast, standard)
                        got = {id(e): measure(e, subset, batch, params) for e in order}
                        s, f = got[id(standard)], got[id(fast)]
                        same &= s["outputs"] == f["outputs"]
                        ratios.append(f["tok_s"] / s["tok_s"])
                        ttft_ratios.append(f["ttft"] / s["ttft"])
                        s_rates.append(s["tok_s"])
                        f_rates.append(f["tok_s"])
                        stats.append(f["stats"])
                    proposed = sum(x["proposed"] for x in stats)
                    accept = sum(x["accepted"] for x in stats) / proposed if proposed else 0.0
                    per_forward = sum(x["emitted"] for x in stats) / max(1, sum(x["steps"] for x in stats))
                    lines.append(
                        f"| {family} | {batch} | {int(statistics.median(len(p) for p in subset))} | "
                        f"{statistics.median(s_rates):.1f} | {statistics.median(f_rates):.1f} | "
                        f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}] | "
                        f"{statistics.median(ttft_ratios):.2f} | {accept:.2f} | {per_forward:.2f} | "
                        f"{'yes' if same else 'NO'} | {draft_share(fast)} |")
                    print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batch1-prompts", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-draft", type=int, default=SpeculativeConfig().max_draft_tokens,
                   help="the fast profile's max_draft_tokens")
    p.add_argument("--draft", default="lookup", help="lookup (prompt lookup), int8 (an int8 copy of the target "
                   "as draft model) or layers:N (the target's first N layers as draft model)")
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset of the families")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    load = os.getloadavg()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    t = time.perf_counter()
    table = run(args)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = (f"# Fast profile (drafts: {args.draft}) vs standard ({when})\n\n"
            f"Command: `benchmarks/fast_profile.py {' '.join(sys.argv[1:])}` at commit {commit}  \n"
            f"Load average at start: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores; "
            f"{args.threads} torch threads; greedy, {args.max_tokens} new tokens; {args.repeats} repeats; "
            f"max_draft_tokens {args.max_draft}; "
            f"took {time.perf_counter() - t:.0f} s\n\n"
            "speed-up = fast / standard output tokens/s in the same repeat; acceptance = accepted / proposed draft "
            "tokens; tokens per forward = tokens emitted per target forward of the fast profile's decode steps; "
            "identical = the greedy outputs of both profiles equal token for token in every repeat.\n")
    text = head + table + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
