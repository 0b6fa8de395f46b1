"""`temper domains list [--pack NAME] [--json]`: the catalog as the platform sees it, packs expanded."""

from __future__ import annotations

import json
from pathlib import Path

from temper.core.errors import CatalogError


def list_domains(args) -> int:
    # lazy: pydantic_settings+yaml (141 ms), via settings, would load at every `temper` start-up
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.packs import describe

    catalog = load_catalog(args.catalog or get_settings().catalog_dir)
    domains = [catalog[n] for n in sorted(catalog)]
    if args.pack:
        # a pack by its name (rg) or by its file's (reasoning_gym.yaml): people meet the file first
        domains = [d for d in domains if args.pack in (d._pack, Path(d.source_file or "").stem)]
        if not domains:
            packs = sorted({f"{d._pack} (file {d.source_file})" for d in catalog.values() if d._pack})
            raise CatalogError(f"--pack {args.pack}: no such pack; packs: {', '.join(packs) or 'none'}")
    rows = describe(domains)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    width = max(len(r["name"]) for r in rows)
    print(f"{'name':<{width}}  {'source':<18} {'family':<15} {'rows':>6} {'ratio':>7}")
    for r in rows:
        print(f"{r['name']:<{width}}  {str(r['source'])[:18]:<18} {r['family']:<15} {r['rows']:>6} {r['ratio']:>7g}")
    n_packs = len({r["pack"] for r in rows if r["pack"]})
    print(f"{len(rows)} domains ({sum(1 for r in rows if r['pack'])} from {n_packs} pack(s))")
    return 0


def register(sub) -> None:
    p = sub.add_parser("domains", help="the domain catalog (packs expanded)")
    s = p.add_subparsers(dest="domains_command", required=True, metavar="SUBCOMMAND")
    ls = s.add_parser("list", help="every domain: name, source, verifier family, rows, sampling ratio")
    ls.add_argument("--catalog", type=Path, default=None, help="domain catalog directory (default: settings)")
    ls.add_argument("--pack", default=None, metavar="NAME",
                    help="only the domains this pack expands to: its name (rg) or its file's (reasoning_gym)")
    ls.add_argument("--json", action="store_true", help="print JSON rows (name, pack, source, family, role, rows, ratio, share: "
                    "the part of an RL batch, over trainable domains; 0 for eval-only ones)")
    ls.set_defaults(func=list_domains)
