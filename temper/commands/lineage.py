"""`temper lineage REF`: model version -> producing run -> parent run -> datasets."""

from __future__ import annotations

import json


def show(args) -> int:
    from infra import lineage

    lineage.configure()
    tree = lineage.lineage_tree(args.ref)
    print(json.dumps(tree.to_dict(), indent=2) if args.format == "json" else lineage.format_tree(tree))
    return 0


def register(sub) -> None:
    p = sub.add_parser("lineage", help="print the lineage of a model version or run")
    p.add_argument("ref", help="MODEL@ALIAS, MODEL/VERSION or an MLflow run id")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=show)
