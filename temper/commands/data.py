"""`temper data generate|validate`: starter datasets and the contract gate."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _catalog_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", type=Path, default=None, help="domain catalog directory (default: settings)")
    p.add_argument("--domain", action="append", default=None, metavar="NAME_OR_GLOB",
                   help="only these domains (repeatable, globs allowed)")


def _domains(args):
    # lazy: pydantic_settings+yaml (141 ms), via settings, would load at every `temper` start-up
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog, select_domains

    catalog = load_catalog(args.catalog or get_settings().catalog_dir)
    return select_domains(catalog, args.domain)


def _bar(items: list, desc: str):
    """A progress bar on an interactive terminal (stderr); nothing when output is piped or logged."""
    # lazy: tqdm (30 ms) would load at every `temper` start-up
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="domain", disable=None, leave=False)


def generate(args) -> int:
    """Write (or keep) the selected domains' datasets; changed digests are announced as Prefect events."""
    # lazy: pandas+pydantic_settings+fsspec+... (540 ms), via datasets, would load at every `temper` start-up
    from tqdm import tqdm

    from temper.data.datasets import DATASET_LISTENERS
    from temper.data.generators import generate_datasets

    domains = _domains(args)
    start = time.perf_counter()
    changes, failed = [], 0
    for d in domains:
        if not d.dataset.generator and not d._pack:
            print(f"skip {d.name}: no generator (brought dataset)")
    DATASET_LISTENERS.append(changes.append)
    try:
        bar = _bar([], "generate")
        bar.total = sum(1 for d in domains if d.dataset.generator or d._pack)

        def show(r) -> None:
            bar.update()
            if r.status == "failed":
                tqdm.write(f"FAIL  {r.domain}: {r.error}", file=sys.stderr)
            else:
                tqdm.write(f"{'wrote' if r.status == 'written' else 'kept '} {r.domain}: {r.uri} sha256={r.digest[:12]}")

        results = generate_datasets(domains, overwrite=args.overwrite, processes=args.processes, progress=show)
        failed = sum(r.status == "failed" for r in results)
        bar.close()
    finally:
        DATASET_LISTENERS.remove(changes.append)
    print(f"{len(domains)} domains in {time.perf_counter() - start:.1f}s" + (f"; {failed} failed (nothing written "
          "for them)" if failed else ""))
    if changes:  # Prefect is imported only when there is something to announce (~1.3 s)
        # lazy: prefect+pandas+pydantic_settings+... (1.8 s), via events, would load at every `temper` start-up
        from tasks.events import DATASET_CHANGED, emit_dataset_changes

        sent = emit_dataset_changes(changes)
        if sent:
            print(f"emitted {DATASET_CHANGED} for {', '.join(c.domain for c in changes)} (triggers `retrain`)")
    return 1 if failed else 0


def validate(args) -> int:
    # lazy: great_expectations+pandas+pydantic_settings+... (4.0 s), via validation, would load at every `temper` start-up
    from temper.lifecycle.validation import format_report, track_validation, validate_domains

    domains = _domains(args)
    if args.track:
        # lazy: pydantic_settings (130 ms), via infra.tracking, would load at every `temper` start-up
        from infra.tracking.connection import configure
        from infra.tracking.runs import lifecycle_run

        configure()
    summary = validate_domains(domains, build_docs=not args.no_docs, progress=not args.json)
    if args.track:
        with lifecycle_run("validate_data", "validate_data", config={"domains": [d.name for d in domains]}):
            track_validation(summary, domains)
    print(json.dumps(summary.to_dict(), indent=2, default=str) if args.json else format_report(summary))
    return 0 if summary.success else 1


def register(sub) -> None:
    p = sub.add_parser("data", help="starter datasets and data contracts")
    s = p.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    g = s.add_parser("generate", help="write the starter domains' datasets to the store (deterministic)")
    _catalog_args(g)
    g.add_argument("--overwrite", action="store_true", help="rewrite datasets that already exist")
    g.add_argument("--processes", type=int, default=2, help="generation workers for pack domains (default 2)")
    g.set_defaults(func=generate)

    v = s.add_parser("validate", help="check every domain dataset against its contract (Great Expectations)")
    _catalog_args(v)
    v.add_argument("--json", action="store_true", help="print the full report as JSON")
    v.add_argument("--no-docs", action="store_true", help="skip building GX Data Docs")
    v.add_argument("--track", action="store_true", help="record the validation (datasets, report) in MLflow")
    v.set_defaults(func=validate)
