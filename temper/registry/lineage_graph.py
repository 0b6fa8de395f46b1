"""The lineage of a model version (or of any run) as one graph, rendered as text, JSON, mermaid, DOT or PNG.

    datasets -> contract validation -> SFT run -> GRPO run -> eval runs -> model version -> aliases

``infra.tracking.tree.lineage_tree`` walks *up* from a run (run -> parent -> datasets). A reviewer
also wants the *siblings*: the stage runs under the same lifecycle run (validate, sft, grpo,
eval), which is what this module adds. Building (``build_graph``) talks to MLflow; assembling
(``assemble``) and rendering are plain functions over plain data, so they are unit-testable.

Every format of ``temper lineage`` renders the same ``LineageGraph``: the text and JSON formats
once walked the tree on their own and showed only the register run, its parent and the datasets
while mermaid showed the whole chain. A node's ``attrs`` (full run ids, git commit, config hash,
dataset sources) are the detail text and JSON add; the nodes and edges are the same everywhere.

The graph is attached to the version's run (``lineage/graph.{json,mmd,dot,png}``), so the
MLflow UI shows it next to the model files. PNG uses matplotlib (already a dependency of
MLflow) with a fixed layered layout: no graphviz binary is needed.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infra.tracking.tree import DatasetRef, RunNode, lineage_tree
from temper.core.tag_names import TAG_BASE_MODEL, TAG_CONFIG_HASH, TAG_DATA_VALIDATION, TAG_DOMAIN, TAG_GIT, TAG_STAGE
from temper.registry.samples import is_version_eval, lifecycle_run_id, stage_runs
from temper.registry.store import aliases_of, client, version_of
from temper.registry.tags import parse_eval_tags
from temper.registry.versions import resolve_ref, split_ref

# Left-to-right order of the layers; also the column of each kind in the PNG. "run": the run a
# run-id reference names when it is none of the stages drawn (a register run, a lone run).
LAYERS = ("dataset", "validation", "sft", "grpo", "eval", "run", "model_version", "alias")
RUN_ATTRS = {"git_commit": TAG_GIT, "config_hash": TAG_CONFIG_HASH, "base_model": TAG_BASE_MODEL}
TRAINING_STAGES = ("sft", "grpo")
ARTIFACT_DIR = "lineage"


@dataclass(frozen=True)
class Node:
    id: str
    kind: str  # one of LAYERS
    label: str
    detail: str = ""
    attrs: dict[str, str] = field(default_factory=dict, compare=False)  # text/JSON only: full ids, sources


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str


@dataclass
class VersionInfo:
    """What the graph needs of a model version (decoupled from MLflow's class for tests)."""

    name: str
    version: str
    aliases: list[str]
    run_id: str | None
    tags: dict[str, str]


@dataclass
class LineageGraph:
    ref: str
    version: VersionInfo | None = None
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    def add(self, node: Node) -> str:
        self.nodes.setdefault(node.id, node)
        return node.id

    def link(self, src: str, dst: str) -> None:
        edge = Edge(src, dst)
        if edge not in self.edges:
            self.edges.append(edge)

    def of_kind(self, kind: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        version = None if self.version is None else {
            k: v for k, v in asdict(self.version).items() if k != "tags"}
        return {"ref": self.ref, "version": version, "nodes": [asdict(n) for n in self.nodes.values()],
                "edges": [asdict(e) for e in self.edges]}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def _dataset_node(d: DatasetRef, validated: bool) -> Node:
    detail = f"digest {d.digest[:12]}" + ("" if validated else " (not validated)")
    attrs = {"digest": d.digest, "source": d.source, **({"context": d.context} if d.context else {})}
    return Node(id=f"ds_{_safe(d.name)}_{_safe(d.digest[:12])}", kind="dataset", label=d.name, detail=detail,
                attrs=attrs)


def _run_attrs(run: RunNode) -> dict[str, str]:
    return {"run_id": run.run_id, **{k: run.tags[t] for k, t in RUN_ATTRS.items() if t in run.tags}}


def _eval_detail(metrics: dict[str, float]) -> str:
    parts = [f"{k}={metrics[k]:.3f}" for k in ("mean_reward", "pass_rate") if k in metrics]
    if "n" in metrics:
        parts.append(f"n={metrics['n']:.0f}")
    return " ".join(parts)


def assemble(ref: str, version: VersionInfo | None, lifecycle: RunNode | None, stages: list[RunNode],
             focus: RunNode | None = None) -> LineageGraph:
    """Layer by layer; each layer is linked from every node of the previous non-empty layer.

    ``version`` None: the graph of a run reference (``focus``, the run it names) instead of a
    model version: its lifecycle's layers, then the run itself when it is none of them (a
    register run, or a lone run such as `temper data validate --track`'s with no validation tag).

    Contract validation is a 'validate' stage run when there is one, else the lifecycle run's
    ``temper.data.validation`` tag (the post-training flow validates, then logs the validated
    datasets on the lifecycle run). A dataset a training stage consumed that is not among the
    validated ones gets its own edge into that stage, marked 'not validated'.
    """
    g = LineageGraph(ref=ref, version=version)
    by_stage: dict[str, list[RunNode]] = {}
    for s in stages:
        by_stage.setdefault(s.tags.get(TAG_STAGE, ""), []).append(s)

    validation_ids: list[str] = []
    validated_sets: list[DatasetRef] = []
    if by_stage.get("validate"):
        for run in by_stage["validate"]:
            result = run.tags.get(TAG_DATA_VALIDATION, "?")
            validation_ids.append(g.add(Node(f"run_{run.run_id}", "validation", "contract validation",
                                             f"{result}, run {run.run_id[:8]}", _run_attrs(run))))
            validated_sets.extend(run.datasets)
    elif lifecycle is not None:
        if TAG_DATA_VALIDATION in lifecycle.tags:
            validation_ids.append(g.add(Node(f"validation_{lifecycle.run_id}", "validation", "contract validation",
                                             f"{lifecycle.tags[TAG_DATA_VALIDATION]}, lifecycle run "
                                             f"{lifecycle.run_id[:8]}", _run_attrs(lifecycle))))
        validated_sets.extend(lifecycle.datasets)
    validated = {(d.name, d.digest) for d in validated_sets} if validation_ids else set()
    dataset_ids = [g.add(_dataset_node(d, bool(validation_ids))) for d in validated_sets]
    for did in dataset_ids:
        for vid in validation_ids:
            g.link(did, vid)
    frontier = validation_ids or dataset_ids

    for stage in TRAINING_STAGES:
        layer = []
        for run in by_stage.get(stage, []):
            sid = g.add(Node(f"run_{run.run_id}", stage, f"{stage.upper()} run", f"{run.name} {run.run_id[:8]}",
                             _run_attrs(run)))
            layer.append(sid)
            for d in run.datasets:
                if (d.name, d.digest) not in validated:
                    g.link(g.add(_dataset_node(d, False)), sid)
        for src in frontier:
            for dst in layer:
                g.link(src, dst)
        frontier = layer or frontier

    evals = parse_eval_tags(version.tags) if version is not None else {}
    layer = []
    # only the version's own evals: the flow also scores the base model under the same lifecycle run
    for run in (r for r in by_stage.get("eval", []) if is_version_eval(r.tags)):
        domain = run.tags.get(TAG_DOMAIN, run.name)
        layer.append(g.add(Node(f"run_{run.run_id}", "eval", f"eval {domain}",
                                f"{_eval_detail(evals.get(domain, {}))} run {run.run_id[:8]}".strip(),
                                _run_attrs(run))))
    if not layer:  # eval results only as version tags (no eval runs recorded)
        layer = [g.add(Node(f"eval_{_safe(d)}", "eval", f"eval {d}", f"{_eval_detail(m)} (no eval run)"))
                 for d, m in evals.items()]
    for src in frontier:
        for dst in layer:
            g.link(src, dst)
    frontier = layer or frontier

    if version is None:
        if focus is not None and not any(n.attrs.get("run_id") == focus.run_id for n in g.nodes.values()):
            fid = g.add(Node(f"run_{focus.run_id}", "run", f"run {focus.name}",
                             " ".join(p for p in (focus.tags.get(TAG_STAGE, ""), focus.run_id[:8]) if p),
                             _run_attrs(focus)))
            for d in focus.datasets:
                g.link(g.add(_dataset_node(d, (d.name, d.digest) in validated)), fid)
            for src in frontier:
                if src != fid and g.nodes[src].kind != "dataset":
                    g.link(src, fid)
        return g
    base = version.tags.get(TAG_BASE_MODEL)
    mv_id = g.add(Node(f"mv_{_safe(version.name)}_{version.version}", "model_version",
                       f"{version.name} v{version.version}",
                       " ".join(p for p in (f"base {base}" if base else "",
                                            f"run {version.run_id[:8]}" if version.run_id else "") if p),
                       {"run_id": version.run_id} if version.run_id else {}))
    for src in frontier:
        g.link(src, mv_id)
    for alias in sorted(version.aliases):
        g.link(mv_id, g.add(Node(f"alias_{_safe(alias)}", "alias", f"@{alias}")))
    return g


def _lifecycle(lifecycle_id: str) -> tuple[RunNode, list[RunNode]]:
    """A lifecycle run and its stage runs, each with its datasets."""
    return (lineage_tree(lifecycle_id).run,
            [lineage_tree(r.info.run_id).run for r in stage_runs(lifecycle_id)])


def _run_graph(ref: str) -> LineageGraph:
    """The graph of a run id: the lifecycle of the run's topmost parent, with the run in it."""
    focus = lineage_tree(ref).run
    root = focus
    while root.parent is not None:
        root = root.parent
    lifecycle, stages = _lifecycle(root.run_id)
    return assemble(ref, None, lifecycle, stages, focus=focus)


def build_graph(ref: str) -> LineageGraph:
    """Resolve ``MODEL@ALIAS`` or ``MODEL/VERSION`` and gather its lifecycle's runs from MLflow;
    anything else is a run id (``_run_graph``)."""
    if split_ref(ref) is None:
        return _run_graph(ref)
    mv = resolve_ref(client(), ref)
    version = VersionInfo(name=mv.name, version=version_of(mv),
                          aliases=sorted(a for a, v in aliases_of(client().get_registered_model(mv.name)).items()
                                         if v == version_of(mv)),
                          run_id=mv.run_id, tags=dict(mv.tags))
    lifecycle_id = lifecycle_run_id(mv)
    lifecycle, stages = _lifecycle(lifecycle_id) if lifecycle_id else (None, [])
    return assemble(ref, version, lifecycle, stages)


# ---- rendering -------------------------------------------------------------------------------

def _ordered(g: LineageGraph) -> list[Node]:
    """Nodes layer by layer (LAYERS order), in the order they were added within a layer."""
    return sorted(g.nodes.values(), key=lambda n: LAYERS.index(n.kind) if n.kind in LAYERS else len(LAYERS))


def to_text(g: LineageGraph) -> str:
    """One line per node (kind, id, label, detail, attrs), upstream first, each followed by its inputs."""
    head = f"lineage of {g.ref}"
    if g.version is not None:
        aliases = f" aliases={','.join(g.version.aliases)}" if g.version.aliases else ""
        head += f": model {g.version.name} v{g.version.version}{aliases}"
    lines = [head]
    inputs: dict[str, list[str]] = {}
    for e in g.edges:
        inputs.setdefault(e.dst, []).append(e.src)
    for n in _ordered(g):
        text = ", ".join(p for p in (n.label, n.detail) if p)
        attrs = " ".join(f"{k}={v}" for k, v in n.attrs.items())
        lines.append(f"{n.kind} {n.id}: {text}" + (f"  {attrs}" if attrs else ""))
        if n.id in inputs:
            lines.append(f"  <- {', '.join(inputs[n.id])}")
    return "\n".join(lines) + "\n"


def to_json(g: LineageGraph) -> str:
    return json.dumps(g.to_dict(), indent=2) + "\n"


_MERMAID_SHAPES = {"dataset": ('[("', '")]'), "model_version": ('[["', '"]]'), "alias": ('(["', '"])')}
_DOT_SHAPES = {"dataset": "cylinder", "model_version": "box3d", "alias": "ellipse"}


def to_mermaid(g: LineageGraph) -> str:
    lines = ["flowchart LR"]
    for n in g.nodes.values():
        text = "<br/>".join(p for p in (n.label, n.detail) if p).replace('"', "#quot;")
        open_, close = _MERMAID_SHAPES.get(n.kind, ('["', '"]'))
        lines.append(f"  {n.id}{open_}{text}{close}")
    lines += [f"  {e.src} --> {e.dst}" for e in g.edges]
    return "\n".join(lines) + "\n"


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def to_dot(g: LineageGraph) -> str:
    lines = ["digraph lineage {", "  rankdir=LR;", '  node [shape=box, style=rounded, fontname="Helvetica"];']
    for n in g.nodes.values():
        label = "\\n".join(_dot_escape(p) for p in (n.label, n.detail) if p)
        shape = _DOT_SHAPES.get(n.kind)
        lines.append(f'  {n.id} [label="{label}"' + (f", shape={shape}" if shape else "") + "];")
    lines += [f"  {e.src} -> {e.dst};" for e in g.edges]
    return "\n".join(lines + ["}"]) + "\n"


_PNG_COLORS = {"dataset": "#dbeafe", "validation": "#fef3c7", "sft": "#e0e7ff", "grpo": "#ede9fe",
               "eval": "#dcfce7", "run": "#f3f4f6", "model_version": "#fde68a", "alias": "#fecaca"}


def render_png(g: LineageGraph, path: str | Path) -> Path:
    """Fixed layered layout: one column per present kind (LAYERS order), nodes spread vertically."""
    # lazy: matplotlib (600 ms) would load in fast unit tests (test_registry_ops_units.py)
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib (600 ms) would load in fast unit tests (test_registry_ops_units.py)
    import matplotlib.pyplot as plt

    columns = [[n for n in g.nodes.values() if n.kind == k] for k in LAYERS]
    columns = [c for c in columns if c]
    rows = max((len(c) for c in columns), default=1)
    fig, ax = plt.subplots(figsize=(2.7 * max(len(columns), 1), max(2.5, 0.9 * rows + 0.8)))
    ax.set_xlim(-0.5, len(columns) - 0.5)
    ax.set_ylim(-0.5, rows - 0.5)
    ax.axis("off")
    texts = {}
    for x, column in enumerate(columns):
        offset = (rows - len(column)) / 2
        for i, n in enumerate(column):
            texts[n.id] = ax.text(x, rows - 1 - (offset + i), "\n".join(p for p in (n.label, n.detail) if p),
                                  ha="center", va="center", fontsize=7,
                                  bbox=dict(boxstyle="round,pad=0.4", fc=_PNG_COLORS.get(n.kind, "white"), ec="0.4"))
    for e in g.edges:
        ax.annotate("", xy=(0, 0.5), xycoords=texts[e.dst], xytext=(1, 0.5), textcoords=texts[e.src],
                    arrowprops=dict(arrowstyle="->", color="0.35", shrinkA=2, shrinkB=2))
    ax.set_title(f"lineage of {g.ref}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attach(g: LineageGraph, run_id: str, png: Path | None = None) -> list[str]:
    """Log the graph (JSON, mermaid, DOT, and the PNG if rendered) to ``run_id``; returns artifact paths."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_registry_ops_units.py)
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    written = []
    client.log_text(run_id, to_json(g), f"{ARTIFACT_DIR}/graph.json")
    client.log_text(run_id, to_mermaid(g), f"{ARTIFACT_DIR}/graph.mmd")
    client.log_text(run_id, to_dot(g), f"{ARTIFACT_DIR}/graph.dot")
    written += [f"{ARTIFACT_DIR}/graph.{ext}" for ext in ("json", "mmd", "dot")]
    if png is not None:
        with tempfile.TemporaryDirectory() as tmp:  # one name in the UI, whatever --out was
            shutil.copyfile(png, Path(tmp) / "graph.png")
            client.log_artifact(run_id, str(Path(tmp) / "graph.png"), ARTIFACT_DIR)
        written.append(f"{ARTIFACT_DIR}/graph.png")
    return written
