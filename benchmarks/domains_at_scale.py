"""Every lifecycle stage at 10, 100 and 300 domains, each next to a baseline measured in the same run.

Domains are N copies of the shipped arithmetic domain (own name, seed and dataset of ``--rows``
rows, the arithmetic contract, the in-process numeric verifier), so every domain costs the same
and growth per domain is the platform's, not the data's. Stages:

1. catalog load: ``load_catalog`` of the N-file catalog (median of 3), plus the shipped catalog once;
2. validation: ``validate_domains`` (GX, worker processes as the CLI uses them) vs a plain-pandas
   run of the same checks, read off the same Contract objects (one process); and the command as a
   person runs it, ``temper data validate`` from a cold start with Data Docs (wall and CPU seconds,
   workers included: the machine is shared, so CPU is the steadier number);
3. the flow's validate stage: the ``validate_data`` flow (one mapped task per domain, shared GX
   validator) under a real Prefect API (``prefect_test_harness``);
4. eval fan-out: the ``evaluate`` task's grouped eval jobs (the model loaded once per shard, 2 shards)
   vs one eval process per domain, the old layout (run at the smallest N only, and only up to 20
   domains: it is linear by construction, and at 300 it would take ~20 min);
5. GRPO: median step time of a 2-rank ZeRO-3 GRPO run mixing N domains vs the 2-domain mix;
6. ``--pack-domains K``: the same GRPO step on the first K domains of the shipped reasoning-gym pack
   (their real data, each completion scored by the task's own scorer in the sandbox's warm pool)
   vs 2 of them, reported apart from the in-process rows (generation of K pack datasets comes first).

Ratios are the result (the machine is noisy): growth = cost per domain at N / cost per domain at the
first N; "vs baseline" = stage / its baseline at the same N.

Run: .venv/bin/python benchmarks/domains_at_scale.py [--sizes 10 100 300] [--rows 1000] [--grpo-steps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workspace import embedded_workspace  # noqa: E402 (benchmarks/workspace.py)


def make_catalog(root: Path, n: int, rows: int) -> Path:
    base = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())
    cat = root / f"catalog-{n}"
    cat.mkdir(parents=True)
    for i in range(n):
        name = f"n{n}_{i:03d}"  # distinct per size: the flow's validation cache key starts with the name
        doc = {**base, "name": name, "sampling_ratio": 1.0,
               "dataset": {**base["dataset"], "uri": f"{{store}}/scale/{name}.jsonl", "rows": rows, "seed": i}}
        (cat / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return cat


def pandas_checks(contract, frame) -> int:
    """The contract's checks written directly in pandas (the baseline): number of failing checks."""
    from data_contracts.rules import RULES

    failing = int(not contract.min_rows <= len(frame) <= (contract.max_rows or len(frame)))
    for name, col in contract.columns.items():
        if name not in frame:
            failing += 1
            continue
        s = frame[name]
        failing += int(col.not_null and s.isna().any())
        if col.type:
            py = {"str": str, "int": int, "float": float, "bool": bool}[col.type]
            failing += int(not s.map(lambda v: isinstance(v, py)).all())
        failing += int(col.unique and s.duplicated().any())
        if col.min_length is not None or col.max_length is not None:
            lengths = s.astype(str).str.len()
            failing += int(not lengths.between(col.min_length or 0, col.max_length or 10**9).all())
        failing += int(col.allowed is not None and not s.isin(col.allowed).all())
        failing += int(bool(col.regex) and not s.astype(str).str.contains(col.regex, regex=True).all())
    if contract.split:
        share = (frame[contract.split.column] == contract.split.eval_value).mean()
        failing += int(not contract.split.eval_fraction_min <= share <= contract.split.eval_fraction_max)
    for r in contract.rules:
        other = frame[r.with_column] if r.with_column else [None] * len(frame)
        failing += int(not all(RULES[r.rule](v, o) for v, o in zip(frame[r.column], other)))
    return failing


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out


def bench_catalog(cat: Path) -> float:
    from temper.data.catalog import load_catalog

    return statistics.median(timed(load_catalog, cat)[0] for _ in range(3))


def bench_validation(domains) -> tuple[float, float]:
    from data_contracts.model import load_contracts
    from temper.data.datasets import load_dataset
    from temper.core.settings import get_settings
    from temper.lifecycle.validation import validate_domains

    settings = get_settings()
    gx_s, summary = timed(validate_domains, domains, build_docs=False)
    assert summary.success, [r for r in summary.reports if not r.success][:1]
    contracts = load_contracts(settings.resolved_contracts_dir)

    def plain():
        return sum(pandas_checks(contracts[d.contract], load_dataset(d, settings).frame) for d in domains)

    pd_s, failing = timed(plain)
    assert failing == 0
    return gx_s, pd_s


def bench_cli(cat: Path) -> tuple[float, float]:
    """``temper data validate --catalog CAT`` in a fresh interpreter (start-up and Data Docs included):
    (wall, CPU seconds of it and its worker processes)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "temper.cli", "data", "validate", "--catalog", str(cat)], check=True,
                   capture_output=True, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_flow_validate(cat: Path) -> float:
    from flows.validate_data import validate_data
    from temper.lifecycle.params import ValidateParams
    from temper.core.settings import get_settings

    os.environ["TEMPER_CATALOG_DIR"] = str(cat)
    get_settings.cache_clear()
    try:
        wall, result = timed(validate_data, ValidateParams())
    finally:
        os.environ["TEMPER_CATALOG_DIR"] = str(REPO / "domains")
        get_settings.cache_clear()
    assert result["success"], result
    return wall


def bench_eval(cat: Path, names: list[str], model: str, per_process: bool) -> tuple[float, float | None]:
    """(grouped eval jobs, one process per domain) wall seconds; the second only when asked."""
    from prefect import flow

    from tasks.evaluation import evaluate
    from temper.lifecycle.params import EvalSettings
    from temper.core.settings import get_settings

    os.environ["TEMPER_CATALOG_DIR"] = str(cat)
    get_settings.cache_clear()
    settings = EvalSettings(limit=4, max_new_tokens=4, shards=2)

    @flow(name="bench-eval")
    def grouped() -> list[dict]:
        return evaluate(model, names, settings, "bench")

    try:
        grouped_s, results = timed(grouped)
        assert [r["domain"] for r in results] == names
        per_s = None
        if per_process:
            def one(name: str) -> None:
                out = Path(os.environ["TEMPER_HOME"]) / "eval-per-process"
                subprocess.run([sys.executable, "-m", "workloads.evaluate", "--model", model, "--domain", name,
                                "--limit", "4", "--max-new-tokens", "4", "--out", str(out)],
                               check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})

            from concurrent.futures import ThreadPoolExecutor

            def all_of_them():
                with ThreadPoolExecutor(2) as pool:  # as many at once as the grouped run's shards
                    list(pool.map(one, names))

            per_s, _ = timed(all_of_them)
    finally:
        os.environ["TEMPER_CATALOG_DIR"] = str(REPO / "domains")
        get_settings.cache_clear()
    return grouped_s, per_s


def bench_grpo(root: Path, cat: Path, names: list[str], model: str, steps: int, label: str) -> float:
    """Median step time (after 3 warm-up steps) of a 2-rank ZeRO-3 GRPO run over ``names``."""
    from infra.launcher_local import run_job
    from temper.training.job import training_job

    out = root / label
    config = {"mode": "grpo", "run_name": label, "base_model": model, "domains": names, "catalog_dir": str(cat),
              "output_dir": str(out), "tracking": False, "export": False, "seed": 0,
              "grpo": {"max_steps": steps, "save_steps": 1000, "num_generations": 4, "max_completion_length": 8,
                       "temperature": 1.0, "beta": 0.0, "learning_rate": 1e-4}}
    path = root / f"{label}.yaml"
    path.write_text(yaml.safe_dump(config))
    lines: list[str] = []
    status = run_job(training_job(str(path), "grpo"), on_line=lines.append, cwd=str(REPO))
    if status != 0:
        raise SystemExit(f"GRPO {label} failed ({status}):\n" + "\n".join(lines[-30:]))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return statistics.median(r["step_time_s"] for r in rows if "step_time_s" in r and r["step"] > 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 300])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--grpo-steps", type=int, default=12)
    ap.add_argument("--skip-grpo", action="store_true")
    ap.add_argument("--pack-domains", type=int, default=0, help="also time GRPO on K sandboxed pack domains")
    ap.add_argument("--only-pack", action="store_true", help="run only the --pack-domains rows")
    args = ap.parse_args()
    if args.only_pack and not args.pack_domains:
        ap.error("--only-pack needs --pack-domains K")

    root = embedded_workspace("temper-scale-")
    from prefect.testing.utilities import prefect_test_harness

    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.training.tiny import init_tiny

    model = str(init_tiny(root / "tiny"))
    shipped_s = bench_catalog(REPO / "domains")
    rows = []
    if args.pack_domains:
        pack_rows = bench_pack_grpo(root, model, args.pack_domains, args.grpo_steps)
        print(json.dumps(pack_rows), file=sys.stderr, flush=True)
    if args.only_pack:
        print_pack(pack_rows)
        return
    with prefect_test_harness(server_startup_timeout=120):
        for i, n in enumerate(args.sizes):
            cat = make_catalog(root, n, args.rows)
            domains = list(load_catalog(cat).values())
            for d in domains:
                generate_domain_dataset(d)
            names = [d.name for d in domains]
            row = {"n": n, "catalog_s": bench_catalog(cat)}
            row["gx_s"], row["pandas_s"] = bench_validation(domains)
            row["cli_s"], row["cli_cpu_s"] = bench_cli(cat)
            row["flow_s"] = bench_flow_validate(cat)
            row["eval_s"], row["eval_per_process_s"] = bench_eval(cat, names, model, per_process=i == 0 and n <= 20)
            if not args.skip_grpo:
                row["grpo_step_s"] = bench_grpo(root, cat, names, model, args.grpo_steps, f"grpo-{n}")
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        base_grpo = None
        if not args.skip_grpo:
            two = make_catalog(root / "two", 2, args.rows)
            for d in load_catalog(two).values():
                generate_domain_dataset(d)
            base_grpo = bench_grpo(root, two, sorted(load_catalog(two)), model, args.grpo_steps, "grpo-2")

    first = rows[0]
    print(f"shipped catalog ({len(load_catalog(REPO / 'domains'))} domains) load: {shipped_s:.2f} s\n")
    print("| domains | stage | seconds | per domain ms | growth per domain vs N=%d | vs baseline |" % first["n"])
    print("|---:|---|---:|---:|---:|---|")
    for r in rows:
        n = r["n"]

        def line(stage, key, baseline=None, base_label=""):
            s = r[key]
            growth = (s / n) / (first[key] / first["n"])
            vs = f"{s / baseline:.2f}x {base_label}" if baseline else ""
            print(f"| {n} | {stage} | {s:.2f} | {1000 * s / n:.1f} | {growth:.2f}x | {vs} |")

        line("catalog load", "catalog_s")
        line("validation (GX, CLI path)", "gx_s", r["pandas_s"], "of plain pandas")
        line("validation (plain pandas baseline)", "pandas_s")
        line("`temper data validate` (cold start, docs)", "cli_s")
        line("  its CPU seconds (workers included)", "cli_cpu_s")
        line("flow validate stage (Prefect)", "flow_s", r["gx_s"], "of GX alone")
        line("eval, grouped jobs (2 shards)", "eval_s", r["eval_per_process_s"], "of one process per domain")
        if r.get("grpo_step_s") is not None and base_grpo:
            print(f"| {n} | GRPO step (median) | {r['grpo_step_s']:.3f} | - | - | "
                  f"{r['grpo_step_s'] / base_grpo:.2f}x of the 2-domain mix ({base_grpo:.3f} s) |")
    if args.pack_domains:
        print_pack(pack_rows)


def bench_pack_grpo(root: Path, model: str, k: int, steps: int) -> dict:
    """GRPO step time on the first ``k`` shipped reasoning-gym pack domains vs 2 of them (sandboxed scoring)."""
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_datasets

    catalog = load_catalog(REPO / "domains")
    pack = sorted(name for name, d in catalog.items() if d._pack == "rg")[:k]
    t = time.perf_counter()
    generate_datasets([catalog[n] for n in pack], processes=2)
    generate_s = time.perf_counter() - t
    many = bench_grpo(root, REPO / "domains", pack, model, steps, f"pack-grpo-{k}")
    two = bench_grpo(root, REPO / "domains", pack[:2], model, steps, "pack-grpo-2")
    return {"k": k, "generate_s": generate_s, "step_k_s": many, "step_2_s": two}


def print_pack(r: dict) -> None:
    print(f"\nreasoning-gym pack, sandboxed scoring (generation of {r['k']} domains: {r['generate_s']:.0f} s)\n")
    print("| domains | GRPO step (median) | vs 2 pack domains |")
    print("|---:|---:|---|")
    print(f"| 2 | {r['step_2_s']:.3f} | 1.00x |")
    print(f"| {r['k']} | {r['step_k_s']:.3f} | {r['step_k_s'] / r['step_2_s']:.2f}x |")


if __name__ == "__main__":
    main()
