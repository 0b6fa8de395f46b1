"""`temper data generate|validate`: starter datasets and the contract gate."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _catalog_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--catalog", type=Path, default=None, help="domain catalog directory (default: settings)")
    p.add_argument("--domain", action="append", default=None, metavar="NAME_OR_GLOB",
                   help="only these domains (repeatable, globs allowed)")


def _domains(args):
    from temper.catalog import load_catalog, select_domains
    from temper.settings import get_settings

    catalog = load_catalog(args.catalog or get_settings().catalog_dir)
    return select_domains(catalog, args.domain)


def generate(args) -> int:
    """Single-file domains one by one; pack domains together (parallel, cached, contract-checked first)."""
    import sys
    import time

    from temper.datasets import generate_domain_dataset
    from temper.pack_data import generate_pack_datasets

    domains = _domains(args)
    start = time.perf_counter()
    for d in domains:
        if d._pack:
            continue
        if not d.dataset.generator:
            print(f"skip {d.name}: no generator (brought dataset)")
            continue
        uri, digest, written = generate_domain_dataset(d, overwrite=args.overwrite)
        print(f"{'wrote' if written else 'kept '} {d.name}: {uri} sha256={digest[:12]}")
    failed = 0
    packed = [d for d in domains if d._pack]

    def show(r) -> None:
        if r.status == "failed":
            print(f"FAIL  {r.domain}: {r.error}", file=sys.stderr, flush=True)
        else:
            print(f"{'wrote' if r.status == 'written' else 'kept '} {r.domain}: {r.uri} sha256={r.digest[:12]}", flush=True)

    if packed:
        results = generate_pack_datasets(packed, overwrite=args.overwrite, processes=args.processes, progress=show)
        for r in results:
            failed += r.status == "failed"
            if r.status == "kept":
                show(r)
    print(f"{len(domains)} domains in {time.perf_counter() - start:.1f}s" + (f"; {failed} failed (nothing written "
          "for them)" if failed else ""))
    return 1 if failed else 0


def validate(args) -> int:
    from temper.validation import format_report, track_validation, validate_domains

    domains = _domains(args)
    if args.track:
        from infra import lineage

        lineage.configure()
    summary = validate_domains(domains, build_docs=not args.no_docs)
    if args.track:
        with lineage.lifecycle_run("validate_data", "validate_data", config={"domains": [d.name for d in domains]}):
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
