"""`temper models` and `temper lineage --format` on the embedded sqlite store and on a real MLflow server.

Versions are registered the way the post-training flow does it: a lifecycle run with the
validated datasets, sft/grpo/eval stage runs under it (eval runs carry per-sample rewards via
``log_eval_samples``), and a register run + ``register_version`` (version, eval tags, gate
alias), as ``tasks.registry.register`` composes them. No training happens: the rewards are chosen, so every
metric below is known exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid

import pytest

from temper.cli import main
from temper.core.tag_names import (
    PARENT_TAG,
    TAG_COMPARE_B,
    TAG_DATA_VALIDATION,
    TAG_DOMAIN,
    TAG_LIFECYCLE_RUN,
    TAG_STAGE,
    VERSION_AUDIT_TAG,
)
from tests.integration.conftest import in_env, store_processes

N = 40


@pytest.fixture(scope="module", params=["sqlite", "server"])
def store(request, tmp_path_factory) -> tuple[str, str | None]:
    """(TEMPER_HOME, tracking URI): the embedded sqlite store (`make demo`'s) or an MLflow server.

    Both, because they differ: sqlite returns model versions as ints, the server as strings.
    """
    uri = request.getfixturevalue("mlflow_server") if request.param == "server" else None
    return str(tmp_path_factory.mktemp(f"home-{request.param}")), uri


@pytest.fixture
def tracked(store, monkeypatch):
    from temper.core.settings import get_settings

    _tracking_env(monkeypatch, store)
    yield store
    get_settings.cache_clear()


@pytest.fixture
def model():
    return f"ops-{uuid.uuid4().hex[:8]}"


def _tracking_env(mp: pytest.MonkeyPatch, store: tuple[str, str | None]) -> None:
    from infra.tracking.connection import configure
    from temper.core.settings import get_settings

    home, uri = store
    mp.setenv("TEMPER_HOME", home)
    for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "TEMPER_S3_ENDPOINT_URL", "MLFLOW_TRACKING_URI"):
        mp.delenv(var, raising=False)
    if uri:
        mp.setenv("TEMPER_TRACKING_URI", uri)
    get_settings.cache_clear()
    mp.setenv("MLFLOW_TRACKING_URI", configure())


def rewards(passed_ids: range | list[int]) -> list[float]:
    """N binary rewards: 1.0 on ``passed_ids``, 0.0 elsewhere (ids are 0..N-1)."""
    ok = set(passed_ids)
    return [1.0 if i in ok else 0.0 for i in range(N)]


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def register(model: str, evals: dict[str, list[float]], *, passed: bool, samples: bool | set[str] = True,
             unvalidated: str | None = None) -> str:
    """One lifecycle as the flow records it; returns the version. ``passed`` = the flow gate's verdict."""
    import mlflow
    import pandas as pd

    from infra.tracking.runs import close_run, log_dataset, open_run, resume_run
    from temper.core.tag_names import TAG_BASE_MODEL, TAG_KIND, TAG_STAGE
    from temper.registry.gate import GateDecision
    from temper.registry.registration import register_version
    from temper.registry.samples import log_eval_samples

    frame = pd.DataFrame({"prompt": ["p"], "answer": ["a"]})
    parent = open_run("post_training", f"{model}-lifecycle", tags={
        TAG_KIND: "lifecycle", TAG_BASE_MODEL: "tiny"})
    with resume_run(parent):
        for d in evals:
            log_dataset(d, frame, f"/store/datasets/{d}.jsonl", digest(d))
        mlflow.set_tag(TAG_DATA_VALIDATION, "pass")
    stage_tags = {TAG_KIND: "stage"}
    for stage in ("sft", "grpo"):
        run_id = open_run("post_training", f"{stage}-{model}", parent_run_id=parent,
                                  tags={**stage_tags, TAG_STAGE: stage})
        if stage == "sft" and unvalidated:
            with mlflow.start_run(run_id=run_id):
                log_dataset(unvalidated, frame, f"/tmp/{unvalidated}.jsonl", digest(unvalidated))
        close_run(run_id)
    results = {}
    for d, rs in evals.items():
        results[d] = {"mean_reward": sum(rs) / len(rs), "pass_rate": sum(r >= 1.0 for r in rs) / len(rs), "n": len(rs)}
        run_id = open_run("post_training", f"eval-{d}", parent_run_id=parent,
                                  tags={**stage_tags, TAG_STAGE: "eval", TAG_DOMAIN: d})
        if samples is True or (samples and d in samples):
            with mlflow.start_run(run_id=run_id):
                log_eval_samples(d, [(f"{d}-{i}", r) for i, r in enumerate(rs)])
        close_run(run_id)
    # the register stage as tasks.registry.register does it (not imported: it pulls in GX, ~10 s here)
    run_id = open_run("post_training", "register", parent_run_id=parent,
                              tags={**stage_tags, TAG_STAGE: "register", TAG_BASE_MODEL: "tiny"})
    with mlflow.start_run(run_id=run_id) as run:
        mlflow.log_text("{}", "model/config.json")
        source = f"{run.info.artifact_uri.rstrip('/')}/model"
    out = register_version(model, source, run_id, eval_results=results,
                           decision=GateDecision(passed=passed, reason="test gate"), alias="champion",
                           fallback_alias="candidate",
                           tags={TAG_BASE_MODEL: "tiny", TAG_LIFECYCLE_RUN: parent})
    close_run(parent)
    return out["version"]


def aliases(model: str) -> dict[str, str]:
    """alias -> version as strings (the sqlite store itself returns ints)."""
    from mlflow.tracking import MlflowClient

    return {a: str(v) for a, v in MlflowClient().get_registered_model(model).aliases.items()}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


GOOD = {"arithmetic": rewards(range(20)), "tool_calls": rewards(range(20))}            # 0.5 / 0.5
BETTER = {"arithmetic": rewards(range(36)), "tool_calls": rewards(range(21))}          # 0.9 / 0.525
BEST = {"arithmetic": rewards(range(38)), "tool_calls": rewards(range(30))}            # 0.95 / 0.75
WORSE = {"arithmetic": rewards(range(10)), "tool_calls": rewards(range(30))}           # 0.25 / 0.75


@pytest.fixture(scope="module")
def shared(store):
    """One model for the tests that only read it (compare, lineage, bad input): v1 @champion, v2, v3 @candidate."""
    from temper.core.settings import get_settings

    name = f"shared-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:
        _tracking_env(mp, store)
        register(name, {**GOOD, "invoice_extraction": rewards(range(10))}, passed=True, unvalidated="scratch")
        register(name, {**BETTER, "invoice_extraction": rewards(range(12)), "code": rewards(range(3))}, passed=False,
                 samples={"arithmetic", "tool_calls", "code"})  # no per-sample rewards for invoice_extraction
        register(name, {"code": rewards(range(5))}, passed=False)
    get_settings.cache_clear()
    return name


def test_promote_rollback_twice_then_nothing_left(tracked, model, capsys):
    assert register(model, GOOD, passed=True) == "1"       # the flow's gate set @champion
    assert register(model, BETTER, passed=False) == "2"    # -> @candidate
    assert register(model, BEST, passed=False) == "3"      # -> @candidate
    assert aliases(model) == {"champion": "1", "candidate": "3"}

    code, out, err = cli(capsys, "models", "promote", model, "2", "--reason", "arithmetic +0.4", "--json")
    assert code == 0, err
    change = json.loads(out)
    assert (change["version"], change["previous"], change["changed"]) == ("2", "1", True)
    assert change["gate"]["passed"] is True and change["event"]["seq"] == 2  # #1: the flow set v1
    code, out, err = cli(capsys, "models", "promote", model, "candidate", "--reason", "best so far")
    assert code == 0, err
    assert out.startswith(f"{model}@champion: v2 -> v3 (promote #3); gate: pass")
    assert aliases(model) == {"champion": "3", "candidate": "3"}

    code, out, _ = cli(capsys, "models", "rollback", model, "--reason", "bad outputs in prod")
    assert code == 0 and out.strip() == f"{model}@champion: v3 -> v2 (rollback #4)"
    code, out, _ = cli(capsys, "models", "rollback", model)
    assert code == 0 and out.strip() == f"{model}@champion: v2 -> v1 (rollback #5)"
    assert aliases(model)["champion"] == "1"
    code, _, err = cli(capsys, "models", "rollback", model)
    assert code == 1
    assert err.strip() == (f"temper: error: {model}@champion: no previous holder in the audit trail "
                           f"(5 event(s); @champion is v1); nothing to roll back to")
    assert aliases(model)["champion"] == "1"

    from mlflow.tracking import MlflowClient

    from temper.registry.aliases import audit_trail

    trail = audit_trail(model)
    assert [(e.action, e.previous, e.version) for e in trail] == [
        ("promote", None, "1"), ("promote", "1", "2"), ("promote", "2", "3"), ("rollback", "3", "2"),
        ("rollback", "2", "1")]
    assert trail[0].reason == "post_training gate: test gate" and trail[0].by.endswith("(post_training flow)")
    assert trail[1].reason == "arithmetic +0.4" and trail[3].reason == "bad outputs in prod"
    assert trail[1].time.endswith("+00:00") and not trail[1].forced
    on_v1 = json.loads(MlflowClient().get_model_version(model, "1").tags[VERSION_AUDIT_TAG.format(alias="champion")])
    assert (on_v1["action"], on_v1["seq"], on_v1["previous"]) == ("rollback", 5, "2")

    code, out, _ = cli(capsys, "models", "list", model, "--json")
    listed = {v["version"]: v for v in json.loads(out)}
    assert list(listed) == ["1", "2", "3"]
    assert listed["1"]["aliases"] == ["champion"] and listed["3"]["aliases"] == ["candidate"]
    assert listed["2"]["base_model"] == "tiny" and listed["2"]["gate_passed"] is False
    assert listed["2"]["evals"]["arithmetic"] == {"mean_reward": 0.9, "pass_rate": 0.9, "n": 40.0}
    assert listed["2"]["datasets"] == [{"name": "arithmetic", "digest": digest("arithmetic")[:32]},
                                       {"name": "tool_calls", "digest": digest("tool_calls")[:32]}]
    assert listed["1"]["created"].endswith("+00:00")
    code, out, _ = cli(capsys, "models", "list", model)
    assert "v1 @champion  created" in out and "eval tool_calls: pass_rate=0.525 mean_reward=0.525 n=40" in out


def test_gate_blocks_promotion_until_forced(tracked, model, capsys):
    register(model, GOOD, passed=True)
    register(model, WORSE, passed=False)
    code, _, err = cli(capsys, "models", "promote", model, "2", "--reason", "try")
    assert code == 1
    # -0.25 on 40 paired samples: significant after Holm over the 2 domains (p well under 0.05/2)
    assert re.fullmatch(rf"temper: error: {model} v2 -> @champion blocked by the gate: arithmetic regressed by "
                        r"0\.250 \(> max_regression 0\.05\) \(p=0\.000\d+, holm-corrected over 2 domain\(s\)\) "
                        r"\(@champion stays v1; --force to override\)", err.strip()), err
    assert aliases(model)["champion"] == "1"
    from temper.registry.aliases import audit_trail

    assert [(e.version, e.reason) for e in audit_trail(model)] == [("1", "post_training gate: test gate")]
    # a looser policy lets it through the gate (mean +0.0: tool_calls +0.25, arithmetic -0.25) -> still a tie
    code, _, err = cli(capsys, "models", "promote", model, "2", "--reason", "try", "--max-regression", "0.3")
    assert code == 1 and "mean improvement +0.000 does not exceed min_improvement 0.0" in err
    code, out, err = cli(capsys, "models", "promote", model, "2", "--reason", "hotfix", "--force")
    assert code == 0, err
    assert "gate: FAIL (forced): arithmetic regressed by 0.250" in out
    assert aliases(model)["champion"] == "2"
    assert audit_trail(model)[-1].forced is True
    events = len(audit_trail(model))
    code, out, _ = cli(capsys, "models", "promote", model, "2", "--reason", "again")
    assert code == 0 and out.strip() == f"{model}@champion already on v2; nothing changed (no audit event)"
    assert len(audit_trail(model)) == events


def test_promote_to_any_alias_is_gated_against_the_champion(tracked, model, capsys):
    """Issue 29.8: `promote candidate --alias staging` said 'no champion yet' while @champion was v1."""
    register(model, GOOD, passed=True)    # v1 @champion
    register(model, WORSE, passed=False)  # v2: arithmetic -0.25
    register(model, BEST, passed=False)   # v3 @candidate: better everywhere
    for alias in ("staging", "canary"):
        code, _, err = cli(capsys, "models", "promote", model, "2", "--alias", alias, "--reason", "try")
        assert code == 1 and f"{model} v2 -> @{alias} blocked by the gate: arithmetic regressed by 0.250" in err, err
        assert f"(@{alias} stays unset; --force to override)" in err
        code, out, err = cli(capsys, "models", "promote", model, "candidate", "--alias", alias, "--reason", "try")
        assert code == 0, err
        assert out.startswith(f"{model}@{alias}: nobody -> v3 (promote #1); gate: pass: mean improvement +0."), out
        assert "no champion" not in out
    code, out, err = cli(capsys, "models", "promote", model, "champion", "--alias", "canary", "--reason", "back")
    assert code == 0 and out.endswith("gate: pass: v1 is @champion itself\n"), (out, err)
    assert aliases(model) == {"champion": "1", "candidate": "3", "staging": "3", "canary": "1"}


def test_bad_input_is_one_clear_line_and_changes_nothing(tracked, shared, capsys):
    model = shared
    cases = {
        ("models", "promote", "no-such-model", "1", "--reason", "x"): "unknown registered model 'no-such-model'",
        ("models", "promote", model, "9", "--reason", "x"): f"{model}: no version 9 (versions: 1, 2, 3)",
        ("models", "promote", model, "staging", "--reason", "x"):
            f"{model}: no alias 'staging' (aliases: candidate->v3, champion->v1)",
        ("models", "promote", model, "2", "--reason", "  "): "a reason is required",
        ("models", "promote", model, "2", "--reason", "x", "--alias", "v7"): f"{model}: cannot set alias 'v7' on v2",
        ("models", "rollback", model): f"{model}@champion: no previous holder in the audit trail (1 event(s)",
        ("models", "compare", model, "1", "3"):
            f"{model}: v1 and v3 share no evaluated domain (v1: arithmetic, invoice_extraction, tool_calls; v3: code)",
        ("models", "compare", model, "1", "champion", "--domains", "x*"):
            f"{model}: no common domain of v1 and v1 matches 'x*' (common: arithmetic, invoice_extraction, tool_calls)",
        ("models", "list", "no-such-model"): "unknown registered model 'no-such-model'",
        ("lineage", f"{model}@nope", "--format", "mermaid"): f"{model}@nope: not found",
    }
    for argv, message in cases.items():
        code, _, err = cli(capsys, *argv)
        assert code == 1, argv
        assert err.startswith("temper: error: ") and message in err, (argv, err)
    assert aliases(model) == {"champion": "1", "candidate": "3"}
    from temper.registry.aliases import audit_trail

    assert [(e.version, e.previous) for e in audit_trail(model)] == [("1", None)]  # the flow's, nothing more
    assert [(e.version, e.previous) for e in audit_trail(model, "candidate")] == [("2", None), ("3", "2")]


def test_compare_known_metrics_with_bootstrap_and_chart(tracked, shared, capsys):
    model = shared
    code, out, err = cli(capsys, "models", "compare", model, "champion", "2", "--json")
    assert code == 0, err
    cmp = json.loads(out)
    rows = {r["domain"]: r for r in cmp["rows"]}
    assert (cmp["a"], cmp["b"], cmp["only_a"], cmp["only_b"]) == ("1", "2", [], ["code"])
    assert list(rows) == ["arithmetic", "invoice_extraction", "tool_calls"]
    ar = rows["arithmetic"]
    assert ar["delta"]["mean_reward"] == pytest.approx(0.4) and ar["delta"]["pass_rate"] == pytest.approx(0.4)
    assert ar["a"]["n"] == ar["b"]["n"] == 40
    iv = ar["interval"]
    assert iv["paired"] and iv["delta"] == pytest.approx(0.4) and 0.2 < iv["lo"] < 0.4 < iv["hi"] < 0.6
    assert ar["hint"].startswith("v2 better (95% CI [+")
    # one extra pass out of 40: not significant; the resampled CI touches 0
    tc = rows["tool_calls"]
    assert tc["delta"]["mean_reward"] == pytest.approx(0.025) and tc["interval"]["lo"] == pytest.approx(0.0, abs=1e-12)
    assert tc["hint"].startswith("no significant difference")
    # invoice_extraction has metrics on both versions but no per-sample rewards on v2
    assert rows["invoice_extraction"]["interval"] is None
    assert rows["invoice_extraction"]["hint"] == "n/a (no per-sample rewards)"
    assert rows["invoice_extraction"]["delta"]["mean_reward"] == pytest.approx(0.05)

    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run = client.get_run(cmp["run_id"])
    assert run.data.tags[TAG_STAGE] == "compare" and run.data.tags[TAG_COMPARE_B] == "2"
    paths = {f.path: f.file_size for f in client.list_artifacts(cmp["run_id"], "compare")}
    assert set(paths) == {"compare/chart.png", "compare/comparison.json"} and paths["compare/chart.png"] > 5000

    code, out, _ = cli(capsys, "models", "compare", model, "1", "2", "--domains", "arith*", "--no-log")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4  # header, column names, one row, "only in v2"
    assert lines[2].split()[:8] == ["arithmetic", "0.500", "->", "0.900", "(+0.400)", "0.500", "->", "0.900"]
    assert "40/40" in lines[2] and "v2 better" in lines[2] and lines[3] == "only in v2 (not compared): code"


def test_lineage_graph_formats_and_artifacts(tracked, shared, tmp_path, capsys):
    model = shared
    code, out, err = cli(capsys, "lineage", f"{model}@champion", "--format", "mermaid")
    assert code == 0, err
    assert out.startswith("flowchart LR\n")
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    mv = client.get_model_version_by_alias(model, "champion")
    artifacts = {f.path for f in client.list_artifacts(mv.run_id, "lineage")}
    assert artifacts == {"lineage/graph.json", "lineage/graph.mmd", "lineage/graph.dot"}
    assert f"attached to run {mv.run_id}" in err
    with open(client.download_artifacts(mv.run_id, "lineage/graph.json", str(tmp_path))) as f:
        graph = json.load(f)
    label = {n["id"]: f"{n['kind']}:{n['label']}" for n in graph["nodes"]}
    edges = {(label[e["src"]], label[e["dst"]]) for e in graph["edges"]}
    domains = ("arithmetic", "invoice_extraction", "tool_calls")
    assert edges == {
        *((f"dataset:{d}", "validation:contract validation") for d in domains),
        ("dataset:scratch", "sft:SFT run"),
        ("validation:contract validation", "sft:SFT run"),
        ("sft:SFT run", "grpo:GRPO run"),
        *(("grpo:GRPO run", f"eval:eval {d}") for d in domains),
        *((f"eval:eval {d}", f"model_version:{model} v1") for d in domains),
        (f"model_version:{model} v1", "alias:@champion"),
    }
    detail = {label[n["id"]]: n["detail"] for n in graph["nodes"]}
    assert detail["dataset:arithmetic"] == f"digest {digest('arithmetic')[:12]}"
    assert detail["dataset:scratch"] == f"digest {digest('scratch')[:12]} (not validated)"
    assert detail["validation:contract validation"].startswith("pass, lifecycle run ")
    assert detail["eval:eval arithmetic"].startswith("mean_reward=0.500 pass_rate=0.500 n=40 run ")
    assert detail["eval:eval invoice_extraction"].startswith("mean_reward=0.250 pass_rate=0.250 n=40 run ")
    assert detail[f"model_version:{model} v1"] == f"base tiny run {mv.run_id[:8]}"
    for e in graph["edges"]:
        assert f"  {e['src']} --> {e['dst']}" in out

    code, out, _ = cli(capsys, "lineage", f"{model}/1", "--format", "dot", "--no-attach")
    assert code == 0 and out.startswith("digraph lineage {") and out.count(" -> ") == len(graph["edges"]) == 13
    png = tmp_path / "g.png"
    code, out, _ = cli(capsys, "lineage", f"{model}@champion", "--format", "png", "--out", str(png))
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "lineage/graph.png" in {f.path for f in client.list_artifacts(mv.run_id, "lineage")}
    code, out, _ = cli(capsys, "lineage", f"{model}@champion")
    assert code == 0 and out.startswith(f"lineage of {model}@champion: model {model} v1 aliases=champion\n")


@pytest.mark.parametrize("of", ["version", "its run", "a stage run"])
def test_lineage_text_and_json_show_the_graph_mermaid_shows(tracked, shared, capsys, of):
    """Issue 29.4: text and json showed the register run, its parent and the datasets; mermaid the whole chain."""
    from mlflow.tracking import MlflowClient

    from tests.unit.test_registry_ops_units import graph_of

    mv = MlflowClient().get_model_version_by_alias(shared, "champion")
    ref = {"version": f"{shared}@champion", "its run": mv.run_id,
           "a stage run": MlflowClient().get_run(mv.run_id).data.tags[PARENT_TAG]}[of]
    if of == "a stage run":  # the sft run under the same lifecycle
        from temper.registry.samples import stage_runs

        ref = next(r.info.run_id for r in stage_runs(ref) if r.data.tags.get(TAG_STAGE) == "sft")
    graphs = {}
    for fmt in ("text", "json", "mermaid", "dot"):
        code, out, err = cli(capsys, "lineage", ref, "--format", fmt, "--no-attach")
        assert code == 0, err
        graphs[fmt] = graph_of(fmt, out)
    nodes, edges = graphs["mermaid"]
    assert graphs["text"] == graphs["json"] == graphs["dot"] == (nodes, edges)
    kinds = {n.split("_", 1)[0] for n in nodes}
    assert {"ds", "validation", "run"} <= kinds
    assert ("mv" in kinds) == (of == "version")
    # 3 datasets -> validation, scratch + validation -> sft -> grpo -> 3 evals (9), then -> v1 -> @champion
    # (13, as in test_lineage_graph_formats_and_artifacts) or -> the register run a run id names (12)
    assert len(edges) == {"version": 13, "its run": 12, "a stage run": 9}[of]


@pytest.mark.slow  # a Prefect server (~20 s to start here), shared with the other flow tests in a full run
def test_promote_and_rollback_flows(tracked, model, prefect_api):
    from flows.registry_ops import promote_model, rollback_model
    from temper.registry.aliases import PromoteParams, RollbackParams

    register(model, GOOD, passed=True)
    register(model, BETTER, passed=False)
    result = promote_model(PromoteParams(model_name=model, version="2", reason="from the UI"))
    assert (result["previous"], result["version"], result["event"]["reason"]) == ("1", "2", "from the UI")
    state = rollback_model(RollbackParams(model_name=model), return_state=True)
    assert state.is_completed() and aliases(model)["champion"] == "1"
    state = rollback_model(RollbackParams(model_name=model), return_state=True)
    assert state.is_failed() and "no previous holder" in str(state.message)
    assert aliases(model)["champion"] == "1"


def _promote_rounds(model: str, i: int, rounds: int, barrier, out) -> None:
    """One promoting process (its own process, MLflow client and store connection).
    Each round it waits for the others, then force-promotes v1 or v2 (alternating by process)."""
    from temper.registry.aliases import promote

    for r in range(rounds):
        barrier.wait(timeout=600)
        try:
            ch = promote(model, "2" if (i + r) % 2 else "1", reason=f"parallel {i}.{r}", force=True)
            out.put((i, r, ch.changed, ch.event.seq if ch.event else None, ch.version, ch.previous, None))
        except Exception as e:  # reported to the parent, asserted there
            out.put((i, r, None, None, None, None, f"{type(e).__name__}: {e}"))


PARALLEL_PROCESSES = 6
PARALLEL_ROUNDS = int(os.environ.get("TEMPER_TEST_PROMOTE_ROUNDS", "2"))  # more rounds = more chances to collide


def test_concurrent_promotions_get_distinct_sequence_numbers(tracked, model):
    """Was: two promotions at once both wrote temper.audit.champion.<N+1>; one event lost.

    Real processes (as two operators' CLIs or a flow and a CLI would be), all promoting
    against the same store: every change gets its own sequence number, the trail has no gap and
    no lost event, each event starts where the last ended, and the alias is where the trail says.
    """
    from mlflow.tracking import MlflowClient

    from temper.registry.aliases import audit_trail
    from temper.registry.audit import holder_stack

    register(model, GOOD, passed=True)
    register(model, BETTER, passed=False)
    start = len(audit_trail(model))
    ctx = store_processes("temper.registry.aliases", __name__)
    barrier, out = ctx.Barrier(PARALLEL_PROCESSES), ctx.Queue()
    env = dict(os.environ)  # TEMPER_HOME and the tracking URI
    procs = [ctx.Process(target=in_env, args=(env, _promote_rounds, model, i, PARALLEL_ROUNDS, barrier, out))
             for i in range(PARALLEL_PROCESSES)]
    for p in procs:
        p.start()
    results = [out.get(timeout=900) for _ in range(PARALLEL_PROCESSES * PARALLEL_ROUNDS)]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * PARALLEL_PROCESSES
    assert not [r for r in results if r[6]], [r[6] for r in results if r[6]]
    changed = [r for r in results if r[2]]
    claimed = sorted(r[3] for r in changed)
    assert len(set(claimed)) == len(claimed), f"sequence numbers claimed twice: {claimed}"
    trail = audit_trail(model)
    new = trail[start:]
    assert [e.seq for e in new] == claimed  # every change has its event, none lost or overwritten
    assert [e.seq for e in trail] == list(range(1, len(trail) + 1))  # distinct and gap-free
    by_seq = {r[3]: r for r in changed}
    for e in new:  # each event is the move its process made
        assert (e.version, e.previous) == (by_seq[e.seq][4], by_seq[e.seq][5])
    for prev, e in zip(trail, trail[1:]):  # each move starts where the last one ended
        assert e.previous == prev.version
    holder = str(MlflowClient().get_model_version_by_alias(model, "champion").version)
    assert holder_stack(trail)[-1] == trail[-1].version == holder
    assert not [m for m in MlflowClient().search_registered_models() if m.name.startswith("temper-lock.")]
