"""`temper lineage REF`: the lineage graph of a model version or a run, in one of five formats.

Every format renders the same graph (``temper.registry.lineage_graph.build_graph``): datasets ->
contract validation -> SFT -> GRPO -> evals -> version -> aliases for ``MODEL@ALIAS`` /
``MODEL/VERSION``; for a run id, the lifecycle that run belongs to, with the run in it.
``text`` and ``json`` add each node's full ids, git commit and dataset sources. The graph formats
(``mermaid|dot|png``) of a model version are also attached to the version's run, so the MLflow UI
shows them; ``--no-attach`` only prints.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

GRAPH_FORMATS = ("mermaid", "dot", "png")


def show(args) -> int:
    # lazy: pydantic_settings (130 ms), via infra.tracking, would load at every `temper` start-up
    from infra.tracking.connection import configure

    # lazy: pydantic_settings (130 ms), via lineage_graph, would load at every `temper` start-up
    from temper.registry import lineage_graph

    configure(existing=True)
    graph = lineage_graph.build_graph(args.ref)
    mv = graph.version
    png = None
    if args.format == "png":
        name = f"{mv.name}-v{mv.version}" if mv else f"run-{args.ref[:8]}"
        png = Path(args.out or f"lineage-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.png")
        lineage_graph.render_png(graph, png)
        print(f"wrote {png}")
    else:
        render = {"text": lineage_graph.to_text, "json": lineage_graph.to_json,
                  "mermaid": lineage_graph.to_mermaid, "dot": lineage_graph.to_dot}[args.format]
        print(render(graph), end="")
    if args.format in GRAPH_FORMATS and not args.no_attach and mv and mv.run_id:
        paths = lineage_graph.attach(graph, mv.run_id, png)
        # stderr, so stdout stays the graph text (pipeable into mmdc / dot)
        print(f"attached to run {mv.run_id}: {', '.join(paths)}", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("lineage", help="print the lineage graph of a model version or run")
    p.add_argument("ref", help="MODEL@ALIAS, MODEL/VERSION or an MLflow run id")
    p.add_argument("--format", choices=["text", "json", *GRAPH_FORMATS], default="text",
                   help="every format shows the same nodes and edges")
    p.add_argument("--out", default=None, help="PNG path (default lineage-<model>-v<version>.png)")
    p.add_argument("--no-attach", action="store_true", help="graph formats: do not log the graph to the version's run")
    p.set_defaults(func=show)
