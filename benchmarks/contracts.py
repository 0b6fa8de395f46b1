"""Contract validation cost: 10/100/300 domains of 1,000 rows, and GX vs plain pandas at 100k rows.

Run: .venv/bin/python benchmarks/contracts.py [--sizes 10 100 300]
Prints a table; ratios, not absolute numbers, are the result (machines are noisy).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def make_catalog(root: Path, n: int) -> Path:
    base = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())
    cat = root / f"catalog-{n}"
    cat.mkdir()
    for i in range(n):
        d = {**base, "name": f"arith_{i:03d}",
             "dataset": {**base["dataset"], "uri": f"{{store}}/bench/arith_{i:03d}.jsonl", "rows": 1000, "seed": i}}
        (cat / f"arith_{i:03d}.yaml").write_text(yaml.safe_dump(d))
    return cat


def bench_domains(sizes: list[int]) -> list[tuple]:
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.core.settings import get_settings
    from temper.lifecycle.validation import validate_domains

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TEMPER_HOME"] = tmp
        get_settings.cache_clear()
        for n in sizes:
            cat = load_catalog(make_catalog(Path(tmp), n))
            domains = list(cat.values())
            for d in domains:
                generate_domain_dataset(d)
            t = time.perf_counter()
            summary = validate_domains(domains, build_docs=False)
            wall = time.perf_counter() - t
            assert summary.success, [r for r in summary.reports if not r.success][:1]
            rows.append((n, wall, wall / n))
    return rows


def pandas_checks(df) -> dict[str, int]:
    """The arithmetic contract written by hand in pandas: the baseline GX is compared with."""
    def num_ok(v):
        try:
            Fraction(str(v).strip())
            return True
        except (ValueError, ZeroDivisionError):
            return False

    q = df["question"]
    return {
        "id_unique": int(df["id"].duplicated(keep=False).sum()),
        "not_null": int(df[["id", "question", "answer", "reference", "split"]].isna().sum().sum()),
        "types": int((~df["question"].map(lambda v: isinstance(v, str))).sum()),
        "length": int((~q.str.len().between(3, 64)).sum()),
        "regex": int((~q.str.contains(r"^-?\d+ [-+*] -?\d+$", regex=True)).sum()),
        "split_values": int((~df["split"].isin(["train", "eval"])).sum()),
        "split_ratio": int(not 0.05 <= (df["split"] == "eval").mean() <= 0.2),
        "numeric": int((~df["answer"].map(num_ok)).sum()),
    }


def bench_large(rows: int = 100_000) -> tuple[float, float]:
    from data_contracts.model import load_contracts
    from data_contracts.runner import GXRunner
    from temper.data.generators import generate

    df = generate("arithmetic", rows, 0, 0.1, {"max_operand": 9, "ops": "+-"})
    contract = load_contracts(REPO / "data_contracts")["arithmetic"]
    runner = GXRunner()
    runner.validate("warmup", contract, df.head(100), dataset_uri="mem", digest="-")
    t = time.perf_counter()
    report = runner.validate("large", contract, df, dataset_uri="mem", digest="-")
    gx_s = time.perf_counter() - t
    t = time.perf_counter()
    counts = pandas_checks(df)
    pd_s = time.perf_counter() - t
    assert report.success and not any(counts.values())
    return gx_s, pd_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 300])
    args = ap.parse_args()
    rows = bench_domains(args.sizes)
    print("| domains | wall s | per domain ms | growth vs linear from first |")
    print("|--------:|-------:|--------------:|----------------------------:|")
    n0, w0, _ = rows[0]
    for n, wall, per in rows:
        print(f"| {n} | {wall:.2f} | {per * 1000:.0f} | {wall / (w0 * n / n0):.2f}x |")
    gx_s, pd_s = bench_large()
    print()
    print("| 100k rows, arithmetic contract | seconds |")
    print("|---|---:|")
    print(f"| Great Expectations | {gx_s:.3f} |")
    print(f"| plain pandas (same checks) | {pd_s:.3f} |")
    print(f"| ratio GX / pandas | {gx_s / pd_s:.2f}x |")


if __name__ == "__main__":
    main()
