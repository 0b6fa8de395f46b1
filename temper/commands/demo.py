"""`temper demo`: as much of the lifecycle as exists, on the embedded default, end to end.

Today: generate the starter domains' datasets, validate them against their contracts
through Great Expectations, and record the lineage (datasets with digests, report, Data
Docs) in MLflow; then print the lineage tree read back from MLflow.
"""

from __future__ import annotations

import time


def demo(args) -> int:
    from infra import lineage
    from temper.catalog import load_catalog, select_domains
    from temper.datasets import generate_domain_dataset
    from temper.settings import get_settings
    from temper.validation import format_report, track_validation, validate_domains

    settings = get_settings()
    t0 = time.time()
    uri = lineage.configure(settings)
    print(f"[1/4] tracking: {uri}\n      store:    {settings.resolved_storage_root}")
    domains = select_domains(load_catalog(settings.catalog_dir), args.domain)
    print(f"[2/4] generating {len(domains)} starter datasets")
    for d in domains:
        if d.dataset.generator:
            ds_uri, digest, written = generate_domain_dataset(d, settings)
            print(f"      {'wrote' if written else 'kept '} {d.name:20s} sha256={digest[:12]} {ds_uri}")
    print("[3/4] validating data contracts (Great Expectations)")
    summary = validate_domains(domains, settings)
    print("      " + format_report(summary).replace("\n", "\n      "))
    print("[4/4] recording lineage in MLflow")
    with lineage.lifecycle_run("demo", "demo-validate", config={"domains": [d.name for d in domains]}) as run:
        track_validation(summary, domains, settings)
    tree = lineage.lineage_tree(run.info.run_id)
    print("      " + lineage.format_tree(tree).replace("\n", "\n      "))
    print(f"done in {time.time() - t0:.1f}s. Not yet part of the demo: SFT, GRPO, eval, registry "
          "(see the open issues).")
    print(f"open the MLflow UI: .venv/bin/mlflow ui --backend-store-uri {uri} --port 5000")
    return 0 if summary.success else 1


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the lifecycle on the embedded default (what `make demo` runs)")
    p.add_argument("--domain", action="append", default=None, metavar="NAME_OR_GLOB")
    p.set_defaults(func=demo)
