"""`temper lineage REF`: model version -> producing run -> parent run -> datasets.

``--format text|json`` print the tree walked up from the run (any run id works).
``--format mermaid|dot|png`` build the whole lifecycle graph of a model version (datasets ->
contract validation -> SFT -> GRPO -> evals -> version -> aliases, see temper.registry.lineage_graph)
and attach it to the version's run, so the MLflow UI shows it; ``--no-attach`` only prints.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

GRAPH_FORMATS = ("mermaid", "dot", "png")


def show(args) -> int:
    # lazy: pydantic_settings (130 ms), via lineage, would load at every `temper` start-up
    from infra import lineage

    lineage.configure(existing=True)
    if args.format in GRAPH_FORMATS:
        return _graph(args)
    tree = lineage.lineage_tree(args.ref)
    print(json.dumps(tree.to_dict(), indent=2) if args.format == "json" else lineage.format_tree(tree))
    return 0


def _graph(args) -> int:
    # lazy: pydantic_settings (130 ms), via lineage_graph, would load at every `temper` start-up
    from temper.registry import lineage_graph

    graph = lineage_graph.build_graph(args.ref)
    mv = graph.version
    png = None
    if args.format == "png":
        png = Path(args.out or f"lineage-{re.sub(r'[^A-Za-z0-9_.-]', '_', mv.name)}-v{mv.version}.png")
        lineage_graph.render_png(graph, png)
        print(f"wrote {png}")
    else:
        print(lineage_graph.to_mermaid(graph) if args.format == "mermaid" else lineage_graph.to_dot(graph), end="")
    if not args.no_attach and mv.run_id:
        paths = lineage_graph.attach(graph, mv.run_id, png)
        # stderr, so stdout stays the graph text (pipeable into mmdc / dot)
        print(f"attached to run {mv.run_id}: {', '.join(paths)}", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("lineage", help="print the lineage of a model version or run")
    p.add_argument("ref", help="MODEL@ALIAS, MODEL/VERSION or an MLflow run id (text/json only)")
    p.add_argument("--format", choices=["text", "json", *GRAPH_FORMATS], default="text")
    p.add_argument("--out", default=None, help="PNG path (default lineage-<model>-v<version>.png)")
    p.add_argument("--no-attach", action="store_true", help="graph formats: do not log the graph to the version's run")
    p.set_defaults(func=show)
