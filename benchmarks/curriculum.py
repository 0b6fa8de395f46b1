"""GRPO curriculum: how many groups carry no signal (all rewards equal), curriculum off vs on.

A group of G completions whose rewards are all equal has zero advantage: its rollouts are wasted.
The baseline is the fixed stratified mix (curriculum off), measured in the same run.

1. Real runs: a tiny model, SFT'd briefly on six arithmetic domains from trivial (0/1 products) to
   hopeless (3-digit sums), then GRPO twice from the same SFT model and seed, curriculum off and
   on, each a real 2-rank ZeRO-3 job through the local launcher. Per run: TRL's
   ``frac_reward_zero_std`` (the fraction of groups with zero reward spread), the mean reward and
   the prompts each domain got. Steps 1-2 are drawn before any reward is in, so the table also
   gives the steps after them.
2. Simulation at 300 domains (no model): 30% hopeless (p=0), 20% solved (p=1), 25% "split"
   (each prompt nearly always or nearly never solved: a mid pass rate, little signal), 25% "mixed"
   (each prompt's p uniform in [0.2, 0.8]); groups of G=4 Bernoulli rewards, P prompts a step,
   the real ``CurriculumStream`` vs the fixed ``DomainMixSampler``.

Run: .venv/bin/python benchmarks/curriculum.py [--steps 40] [--seeds 2] [--sft-steps 150] [--sim-only]
(~6 min on 2 idle cores; --sim-only: ~30 s)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from temper.training.config import CurriculumSettings, nest_stage_fields  # noqa: E402
from workspace import embedded_workspace  # noqa: E402 (benchmarks/workspace.py)

# name -> (ops, max_operand): from solved to hopeless for a tiny char model after a short SFT
LADDER = {"mul-bits": ("*", 1), "add-tiny": ("+", 2), "add-9": ("+-", 9), "mul-5": ("*", 5),
          "mul-99": ("*", 99), "add-999": ("+", 999)}


def write_catalog(root: Path) -> Path:
    base = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())
    catalog = root / "catalog"
    catalog.mkdir()
    for i, (name, (ops, top)) in enumerate(LADDER.items()):
        domain = {**base, "name": name, "description": f"{ops} on operands up to {top}", "sampling_ratio": 1.0}
        domain["dataset"] = {**base["dataset"], "uri": f"{{store}}/datasets/{name}.jsonl", "rows": 600, "seed": i,
                             "generator_params": {"max_operand": top, "ops": ops}}
        (catalog / f"{name}.yaml").write_text(yaml.safe_dump(domain, sort_keys=False))
    return catalog


def run(root: Path, name: str, mode: str, **fields) -> list[dict]:
    from infra.launcher_local import run_job
    from temper.training.job import training_job

    cfg = {"run_name": name, "mode": mode, "domains": list(LADDER), "output_dir": str(root / name),
           "tracking": False, "seed": 0, **fields}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(nest_stage_fields(cfg)))
    lines: list[str] = []
    status = run_job(training_job(str(path), mode), on_line=lines.append, cwd=str(REPO))
    if status != 0:
        raise SystemExit(f"{name} failed ({status}):\n" + "\n".join(lines[-30:]))
    return [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summarise(rows: list[dict], from_step: int = 1) -> dict:
    steps = [r for r in rows if "loss" in r and r["step"] >= from_step]
    prompts = {d: sum(1 for r in steps if f"reward/{d}" in r) for d in LADDER}
    return {"zero_signal": mean([r["frac_reward_zero_std"] for r in steps]), "reward": mean([r["reward"] for r in steps]),
            "steps_with": prompts}


def real_runs(steps: int, sft_steps: int, seeds: tuple[int, ...]) -> None:
    root = embedded_workspace("temper-curriculum-")
    import os

    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.training.tiny import init_tiny

    os.environ["TEMPER_CATALOG_DIR"] = str(write_catalog(root))
    get_settings.cache_clear()
    for domain in load_catalog(os.environ["TEMPER_CATALOG_DIR"]).values():
        generate_domain_dataset(domain)
    init_tiny(root / "tiny")
    run(root, "sft", "sft", base_model=str(root / "tiny"), seed=0, max_steps=sft_steps, learning_rate=3e-3,
        per_device_batch_size=16, save_steps=10_000)
    common = dict(base_model=str(root / "sft" / "model"), max_steps=steps, learning_rate=3e-4, per_device_batch_size=8,
                  num_generations=4, max_completion_length=4, temperature=0.8, save_steps=10_000, export=False)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for seed in seeds:
        runs["off"] += run(root, f"grpo-off-{seed}", "grpo", seed=seed, **common)
        runs["on"] += run(root, f"grpo-on-{seed}", "grpo", seed=seed, curriculum={"enabled": True}, **common)
    print(f"\nReal runs: tiny model, SFT {sft_steps} steps, GRPO {steps} steps x 4 prompts x G=4, 2 ZeRO-3 ranks, "
          f"seeds {seeds} (rows pooled)")
    print(f"{'':18}{'zero-signal groups':>20}{'(steps >= 3)':>14}{'mean reward':>13}   steps sampled per domain")
    for label, rows in (("curriculum off", runs["off"]), ("curriculum on", runs["on"])):
        everything, steered = summarise(rows), summarise(rows, 3)
        per = " ".join(f"{d}:{n}" for d, n in everything["steps_with"].items())
        print(f"{label:18}{everything['zero_signal']:>20.3f}{steered['zero_signal']:>14.3f}"
              f"{everything['reward']:>13.3f}   {per}")
    last = [r for r in runs["on"] if "loss" in r][-1]
    print("final weights (on, last seed): " + " ".join(f"{d}:{last[f'weight/{d}']:.3f}" for d in LADDER))
    off = runs["off"]
    pass_rates = {d: mean([r[f"pass_rate/{d}"] for r in off if f"pass_rate/{d}" in r]) for d in LADDER}
    print("pass rate per domain (off): " + " ".join(f"{d}:{p:.2f}" for d, p in pass_rates.items()))


def simulate(curriculum: bool, steps: int, prompts: int, seed: int = 0, group: int = 4) -> float:
    """Fraction of groups without signal over a run of the real stream (or the fixed sampler)."""
    from temper.training.curriculum import CurriculumStream
    from temper.training.mixing import DomainMixSampler

    rng = random.Random(seed)
    names = [f"d{i:03d}" for i in range(300)]
    kinds = {n: rng.choice(["hopeless"] * 6 + ["solved"] * 4 + ["split"] * 5 + ["mixed"] * 5) for n in names}

    def pass_probability(name: str, idx: int) -> float:  # per prompt: what the model does on that prompt
        r = random.Random(f"{seed}:{name}:{idx}").random()
        return {"hopeless": 0.0, "solved": 1.0, "split": 0.02 if r < 0.5 else 0.98, "mixed": 0.2 + 0.6 * r}[kinds[name]]

    sampler = DomainMixSampler(sizes={n: 100 for n in names}, ratios={n: 1.0 for n in names}, seed=seed)
    stream = CurriculumStream(sampler, CurriculumSettings(enabled=True), prompts) if curriculum else None
    draws, zero = random.Random(seed + 1), 0
    for batch in range(steps):
        slots = [stream.slot(batch * prompts + i) for i in range(prompts)] if stream else sampler.take(prompts)
        totals: dict[str, list[int]] = {}
        for name, idx in slots:
            p = pass_probability(name, idx)
            passed = sum(draws.random() < p for _ in range(group))
            zero += passed in (0, group)
            row = totals.setdefault(name, [0, 0, 0, 0])
            row[0], row[1], row[2], row[3] = row[0] + group, row[1] + passed, row[2] + 1, row[3] + (0 < passed < group)
        if stream:
            stream.observe(batch, totals)
    return zero / (steps * prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=2, help="GRPO seeds, each run off and on")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--sim-only", action="store_true")
    args = parser.parse_args()
    print("Simulation: 300 domains (30% hopeless, 20% solved, 25% split per prompt, 25% mixed), G=4, 3 seeds")
    print(f"{'prompts/step':>12}{'steps':>7}{'zero-signal off':>17}{'on':>8}{'ratio on/off':>14}")
    for prompts, steps in ((4, 500), (16, 500), (64, 200)):
        off = mean([simulate(False, steps, prompts, s) for s in range(3)])
        on = mean([simulate(True, steps, prompts, s) for s in range(3)])
        print(f"{prompts:>12}{steps:>7}{off:>17.3f}{on:>8.3f}{on / off:>14.2f}")
    if not args.sim_only:
        real_runs(args.steps, args.sft_steps, tuple(range(args.seeds)))


if __name__ == "__main__":
    main()
