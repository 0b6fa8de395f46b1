"""Pure parts of registry operations: eval tags, audit trail replay, bootstrap, comparison, graph rendering."""

from __future__ import annotations

import json

import pytest

from infra.tracking.tree import DatasetRef, RunNode
from temper.core.tag_names import (
    EVAL_TAG,
    TAG_DATA_VALIDATION,
    TAG_DOMAIN,
    TAG_GIT,
    TAG_STAGE,
)
from temper.registry.aliases import PromoteParams, RollbackParams
from temper.registry.audit import AuditEvent, audit_events, holder_stack, rollback_target
from temper.registry.bootstrap import bootstrap_delta
from temper.registry.compare import compare_metrics, significance_hint
from temper.registry.lineage_graph import VersionInfo, assemble, to_dot, to_mermaid
from temper.registry.samples import parse_eval_samples
from temper.registry.store import RegistryOpError
from temper.registry.tags import parse_eval_tags


def event(seq, action, version, previous, alias="champion"):
    return AuditEvent(seq=seq, action=action, alias=alias, version=version, previous=previous, time="t", reason="r",
                      by="me")


def test_eval_tags_parse_with_dotted_domains_and_skip_junk():
    # the stored keys spelled out on purpose: the parser must read what is on the wire, dotted domains included
    tags = {"temper.eval.arithmetic.mean_reward": "0.5", "temper.eval.arithmetic.n": "40",
            "temper.eval.code.v2.pass_rate": "0.25", "temper.eval.bad.mean_reward": "x", "temper.gate.passed": "true"}
    assert parse_eval_tags(tags) == {"arithmetic": {"mean_reward": 0.5, "n": 40.0}, "code.v2": {"pass_rate": 0.25}}


def test_audit_events_read_in_seq_order_and_ignore_other_aliases_and_garbage():
    e1, e2 = event(1, "promote", "2", "1"), event(2, "rollback", "1", "2")
    # the stored keys spelled out on purpose: the trail is read back from what is on the wire
    tags = {"temper.audit.champion.000002": e2.to_json(), "temper.audit.champion.000001": e1.to_json(),
            "temper.audit.candidate.000001": event(1, "promote", "5", None, "candidate").to_json(),
            "temper.audit.champion.000003": "{not json", "temper.audit.champion": e1.to_json()}
    assert audit_events(tags, "champion") == [e1, e2]


def test_rollbacks_walk_back_through_promotions():
    trail = [event(1, "promote", "2", "1"), event(2, "promote", "3", "2")]
    assert holder_stack(trail) == ["1", "2", "3"]
    assert rollback_target(trail, "3") == "2"
    trail.append(event(3, "rollback", "2", "3"))
    assert rollback_target(trail, "2") == "1"
    trail.append(event(4, "rollback", "1", "2"))
    assert holder_stack(trail) == ["1"] and rollback_target(trail, "1") is None


def test_promote_after_rollback_and_alias_moved_outside_the_trail():
    trail = [event(1, "promote", "2", None), event(2, "promote", "3", "2"), event(3, "rollback", "2", "3"),
             event(4, "promote", "5", "2")]
    assert holder_stack(trail) == ["2", "5"]
    assert rollback_target(trail, "5") == "2"
    # the flow moved the alias to v6 without an event: back to the last recorded holder
    assert rollback_target(trail, "6") == "5"
    assert rollback_target([], "1") is None


def test_bootstrap_paired_interval_is_reproducible_and_excludes_zero_for_a_clear_gain():
    a = [(str(i), 1.0 if i < 20 else 0.0) for i in range(40)]
    b = [(str(i), 1.0 if i < 36 else 0.0) for i in range(40)]
    iv = bootstrap_delta(a, b, seed=0)
    assert iv.paired and iv.delta == pytest.approx(0.4) and (iv.n_a, iv.n_b) == (40, 40)
    assert 0.2 < iv.lo < 0.4 < iv.hi < 0.6
    assert bootstrap_delta(a, b, seed=0) == iv
    assert significance_hint(iv, "1", "2").startswith("v2 better (95% CI [+0.")
    worse = bootstrap_delta(b, a, seed=0)
    assert worse.hi < 0 and significance_hint(worse, "2", "1").startswith("v2 better")


def test_bootstrap_unpaired_when_ids_differ_and_none_without_scored_samples():
    a = [(f"a{i}", 0.5) for i in range(10)] + [("x", None)]
    b = [(f"b{i}", 0.5) for i in range(12)]
    iv = bootstrap_delta(a, b)
    assert not iv.paired and (iv.delta, iv.lo, iv.hi) == pytest.approx((0.0, 0.0, 0.0)) and iv.n_a == 10
    assert significance_hint(iv, "1", "2") == "no significant difference (95% CI [+0.000, +0.000])"
    assert bootstrap_delta([("x", None)], b) is None
    assert significance_hint(None, "1", "2") == "n/a (no per-sample rewards)"


def test_eval_samples_format_round_trips():
    text = "\n".join(json.dumps(o) for o in ({"id": "a", "reward": 1}, {"id": 7, "reward": None})) + "\n\n"
    assert parse_eval_samples(text) == [("a", 1.0), ("7", None)]


def test_compare_metrics_errors_name_versions_and_domains():
    m = {"mean_reward": 0.5, "pass_rate": 0.5, "n": 10}
    with pytest.raises(RegistryOpError, match=r"m: v1 and v2 share no evaluated domain \(v1: a; v2: b\)"):
        compare_metrics("m", "1", "2", {"a": m}, {"b": m}, {}, {})
    with pytest.raises(RegistryOpError, match=r"no common domain of v1 and v2 matches 'z\*' \(common: a\)"):
        compare_metrics("m", "1", "2", {"a": m}, {"a": m}, {}, {}, "z*")
    cmp = compare_metrics("m", "1", "2", {"a": m, "c": m}, {"a": {**m, "mean_reward": 0.75}, "d": m}, {}, {})
    assert [r.domain for r in cmp.rows] == ["a"] and cmp.rows[0].delta == pytest.approx(
        {"pass_rate": 0.0, "mean_reward": 0.25, "n": 0})
    assert (cmp.only_a, cmp.only_b) == (["c"], ["d"])


def test_params_validate_what_the_ui_form_would_send():
    with pytest.raises(ValueError, match="reason"):
        PromoteParams(model_name="m", version="2", reason="")
    assert RollbackParams(model_name="m").alias == "champion"
    from prefect.utilities.callables import parameter_schema

    from flows.registry_ops import promote_model, rollback_model

    schema = parameter_schema(promote_model.fn).model_dump()
    assert schema["required"] == ["params"]
    fields = schema["definitions"]["PromoteParams"]["properties"]
    assert {"model_name", "version", "alias", "reason", "force", "policy"} <= set(fields)
    assert "RollbackParams" in parameter_schema(rollback_model.fn).model_dump()["definitions"]


def _run(run_id, stage, datasets=(), **tags):
    return RunNode(run_id=run_id, name=f"{stage}-x", experiment_id="0",
                   tags={TAG_STAGE: stage, **tags}, datasets=list(datasets))


def test_graph_without_validation_or_sft_links_datasets_to_the_first_stage():
    ds = DatasetRef(name="arith", digest="d" * 32, source="s", context="training")
    lifecycle = RunNode(run_id="L" * 32, name="life", experiment_id="0", tags={}, datasets=[ds])
    version = VersionInfo(name="m", version="4", aliases=["champion", "b"], run_id="R" * 32,
                          tags={EVAL_TAG.format(domain="arith", metric="mean_reward"): "0.5"})
    g = assemble("m@champion", version, lifecycle, [_run("G" * 32, "grpo"), _run("X" * 32, "register")])
    kinds = {n.id: n.kind for n in g.nodes.values()}
    assert sorted(kinds.values()) == ["alias", "alias", "dataset", "eval", "grpo", "model_version"]
    assert [(kinds[e.src], kinds[e.dst]) for e in g.edges] == [
        ("dataset", "grpo"), ("grpo", "eval"), ("eval", "model_version"), ("model_version", "alias"),
        ("model_version", "alias")]
    assert g.of_kind("eval")[0].detail == "mean_reward=0.500 (no eval run)"
    assert g.of_kind("dataset")[0].detail == "digest dddddddddddd (not validated)"


def test_renderers_escape_quotes():
    version = VersionInfo(name='we"ird', version="1", aliases=[], run_id=None, tags={})
    g = assemble("ref", version, None, [])
    assert to_mermaid(g) == 'flowchart LR\n  mv_we_ird_1[["we#quot;ird v1"]]\n'
    assert 'mv_we_ird_1 [label="we\\"ird v1", shape=box3d];' in to_dot(g)


def test_report_at_hundreds_of_domains_summarises_and_keeps_the_full_table():
    """Past 20 domains the report counts improved/regressed/unchanged and shows the worst and best ten;
    every domain is still in the CSV that goes to MLflow."""
    import csv
    import io

    from temper.lifecycle.report import before_after_markdown, domain_csv, domain_rows

    names = [f"rg-task{i:03d}-easy" for i in range(300)]
    before = {n: 0.5 for n in names}
    after = {n: 0.5 + (i % 3 - 1) * 0.01 * (i + 1) for i, n in enumerate(names)}  # -, 0, + in turn
    text = before_after_markdown(before, after, None)
    assert "300 domains: **100 improved, 100 regressed, 100 unchanged**" in text
    assert text.count("\n| rg-task") == 20 and "Worst 10 by delta" in text and "Best 10 by delta" in text
    worst = text.split("### Worst")[1].split("### Best")[0]
    assert "| rg-task297-easy |" in worst  # the largest drop: i = 297 (i % 3 == 0), delta -2.98
    rows = list(csv.DictReader(io.StringIO(domain_csv(domain_rows(before, after, None)))))
    assert len(rows) == 300 and {r["domain"] for r in rows} == set(names)
    small = before_after_markdown({"a": 0.1}, {"a": 0.2}, {"a": 0.15})
    assert small.splitlines()[2] == "| a | 0.100 | 0.200 | +0.100 | 0.150 |"


def graph_of(fmt: str, out: str) -> tuple[set[str], set[tuple[str, str]]]:
    """(node ids, edges) as a rendering shows them: what every format must agree on (issue 29.4)."""
    import json
    import re

    if fmt == "json":
        g = json.loads(out)
        return {n["id"] for n in g["nodes"]}, {(e["src"], e["dst"]) for e in g["edges"]}
    if fmt == "mermaid":
        return (set(re.findall(r"^  (\w+)[\[(]", out, re.M)),
                set(re.findall(r"^  (\w+) --> (\w+)$", out, re.M)))
    if fmt == "dot":
        return set(re.findall(r"^  (\w+) \[label=", out, re.M)), set(re.findall(r"^  (\w+) -> (\w+);$", out, re.M))
    nodes, edges, current = set(), set(), None
    for line in out.splitlines()[1:]:  # text: "KIND ID: ..." per node, "  <- SRC, SRC" for its inputs
        if line.startswith("  <- "):
            edges |= {(src, current) for src in line[5:].split(", ")}
        else:
            current = line.split(" ", 2)[1].rstrip(":")
            nodes.add(current)
    return nodes, edges


def _lifecycle_graph(version):
    ds = [DatasetRef(name=n, digest=n[0] * 32, source=f"/store/{n}.jsonl", context="training") for n in ("a", "b")]
    lifecycle = RunNode(run_id="L" * 32, name="life", experiment_id="0",
                        tags={TAG_DATA_VALIDATION: "pass", TAG_GIT: "abc"}, datasets=ds)
    scratch = DatasetRef(name="scratch", digest="s" * 32, source="/tmp/s", context=None)
    stages = [_run("S" * 32, "sft", [scratch]), _run("G" * 32, "grpo"), _run("E" * 32, "eval", **{TAG_DOMAIN: "a"}),
              _run("F" * 32, "eval", **{TAG_DOMAIN: "b"}), _run("R" * 32, "register")]
    return assemble("m@champion" if version else "R" * 32, version, lifecycle, stages,
                    focus=None if version else stages[-1])


@pytest.mark.parametrize("of", ["version", "run"])
def test_every_format_renders_the_same_nodes_and_edges(of):
    from temper.registry.lineage_graph import to_json, to_text

    version = VersionInfo(name="m", version="2", aliases=["champion"], run_id="R" * 32,
                          tags={EVAL_TAG.format(domain="a", metric="mean_reward"): "0.5"}) if of == "version" else None
    g = _lifecycle_graph(version)
    expected = (set(g.nodes), {(e.src, e.dst) for e in g.edges})
    assert len(expected[0]) >= 8 and len(expected[1]) >= 8
    for fmt, render in (("text", to_text), ("json", to_json), ("mermaid", to_mermaid), ("dot", to_dot)):
        assert graph_of(fmt, render(g)) == expected, fmt
    text = to_text(g)
    assert "source=/store/a.jsonl" in text and "git_commit=abc" in text and f"run_id={'S' * 32}" in text
    if of == "run":  # the register run a run id names is drawn, downstream of the evals
        assert f"run run_{'R' * 32}: run register-x, register RRRRRRRR  run_id={'R' * 32}" in text
        assert (f"run_{'E' * 32}", f"run_{'R' * 32}") in expected[1]
