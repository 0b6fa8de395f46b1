"""Sandbox overhead: 200 small Python test programs at concurrency 1, 2, 8.

Modes: bare ``python3 -I`` subprocess in a temp dir (baseline, no isolation), cold sandbox (a
new bwrap box per program: create, write, run, destroy), warm pool (``SandboxPool`` of
``concurrency`` boxes plus as many spares, reclaimed between programs; each box's fork server,
see infra/sandbox/forkserver.py, forks the program instead of starting an interpreter). Each program is a starter python_functions
record with its reference solution and ``check`` (prompt + body + test + check call).

Run: .venv/bin/python benchmarks/sandbox.py [--n 200] [--concurrency 1 2 8]
Prints a table; ratios against the baseline measured in the same run are the result.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def programs(n: int) -> list[str]:
    from temper.data.generators import generate

    recs = generate("python_functions", n, 7, 0.1, {}).to_dict(orient="records")
    return [f"{r['prompt']}{r['reference']}\n{r['test']}\ncheck({r['entry_point']})\n" for r in recs]


def bare(code: str, limits) -> bool:
    from infra.sandbox.process import run_process

    with tempfile.TemporaryDirectory() as d:
        Path(d, "main.py").write_text(code)
        return run_process(["/usr/bin/python3", "-I", "main.py"], limits, cwd=d,
                           env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}).ok


def run_mode(mode: str, codes: list[str], concurrency: int) -> tuple[float, list[float], int]:
    from infra.sandbox import SandboxPool, get_profile
    from infra.sandbox.bwrap import BwrapBackend

    profile = get_profile("python")
    backend = BwrapBackend()
    pool = SandboxPool(profile, size=concurrency, backend=backend) if mode == "warm pool" else None
    if pool:  # a warm pool is measured warm: every box's fork server started before the clock does
        for fut in [pool.submit(code="pass") for _ in range(pool.size + pool.spare)]:
            fut.result()

    def one(code: str) -> tuple[float, bool]:
        t = time.perf_counter()
        if mode == "bare python -I":
            ok = bare(code, profile.limits)
        elif mode == "cold sandbox":
            box = backend.create_box(profile)
            try:
                box.write_files({"main.py": code})
                ok = box.run(list(profile.code_argv), profile.limits).ok
            finally:
                box.close()
        else:
            ok = pool.exec(code=code).ok
        return time.perf_counter() - t, ok

    start = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        results = list(ex.map(one, codes))
    wall = time.perf_counter() - start
    if pool:
        pool.close()
    backend.close()
    return wall, [r[0] for r in results], sum(not r[1] for r in results)


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 8])
    args = ap.parse_args()
    codes = programs(args.n)
    print(f"{args.n} programs per cell; throughput in programs/s; latency per program in ms\n")
    print("| mode | conc | wall s | programs/s | p50 ms | p99 ms | failures | wall vs bare |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for c in args.concurrency:
        base = None
        for mode in ("bare python -I", "cold sandbox", "warm pool"):
            wall, lat, failures = run_mode(mode, codes, c)
            base = base or wall
            print(f"| {mode} | {c} | {wall:.2f} | {args.n / wall:.1f} | {pct(lat, 50) * 1000:.1f} | "
                  f"{pct(lat, 99) * 1000:.1f} | {failures} | {wall / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
