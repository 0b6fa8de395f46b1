"""The registry as the real post_training flow writes it.

Two consecutive runs of the flow (tiny model, 20 SFT steps, 1 GRPO step, 16 eval items, one
rank, same seed: two identical models) against one registry on the embedded sqlite store (what
`make demo` writes). The pair of runs is shared by every test here (module scope); tests that
move aliases come after the ones that only read. The stores differ where it hurt (sqlite returns
model versions as ints, the server as strings): test_registry_ops proves every registry command,
concurrent promotions included, on both stores with versions registered as the flow registers
them, without training; test_flow_post_training runs the flow against an MLflow server.
"""

from __future__ import annotations

import json

import pytest

from temper.cli import main
from temper.core.tag_names import (
    EVAL_TAG,
    TAG_DOMAIN,
    TAG_EVAL_LABEL,
    TAG_FAILED_STAGE,
    TAG_FLOW_RUN,
    TAG_LIFECYCLE_RUN,
    TAG_STAGE,
)
from tests.conftest import REPO

pytestmark = pytest.mark.slow  # two real post_training runs per store


MODEL = "temper-demo"
DOMAINS = ["arithmetic", "multiplication"]


def _params(**kw):
    from temper.lifecycle.params import EvalSettings, GRPOSettings, PostTrainingParams, SFTStage

    fields = dict(model_name=MODEL, domains=DOMAINS, world_size=1, sft=SFTStage(max_steps=20),
                  grpo=GRPOSettings(max_steps=1), eval=EvalSettings(limit=16))
    return PostTrainingParams(**{**fields, **kw})


def _env(mp: pytest.MonkeyPatch, home, uri: str | None) -> str:
    from infra.tracking.connection import configure
    from temper.core.settings import get_settings

    mp.setenv("TEMPER_HOME", str(home))
    mp.setenv("TEMPER_CATALOG_DIR", str(REPO / "domains"))
    for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "TEMPER_S3_ENDPOINT_URL", "MLFLOW_TRACKING_URI"):
        mp.delenv(var, raising=False)
    if uri:
        mp.setenv("TEMPER_TRACKING_URI", uri)
    get_settings.cache_clear()
    resolved = configure()
    mp.setenv("MLFLOW_TRACKING_URI", resolved)
    return resolved


@pytest.fixture(scope="module")
def flow_registry(tmp_path_factory, prefect_api):
    """Two real post_training runs into one registry; yields what they returned."""
    from flows.post_training import post_training
    from temper.core.settings import get_settings

    with pytest.MonkeyPatch.context() as mp:
        _env(mp, tmp_path_factory.mktemp("home"), None)
        assert main(["data", "generate", *(f"--domain={d}" for d in DOMAINS)]) == 0
        yield {"states": [post_training(_params(), return_state=True) for _ in (1, 2)]}
    get_settings.cache_clear()


def _task_runs(state) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))


def _logs(task_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId

    with get_client(sync_client=True) as client:
        return [log.message for log in client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id])))]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _client():
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def _mean(samples) -> float:
    scored = [r for _, r in samples if r is not None]
    return sum(scored) / len(scored)


def _eval_runs(version: str) -> dict[tuple[str, str], str]:
    """(label, domain) -> eval run id, under the version's lifecycle run."""
    from temper.registry.samples import stage_runs

    mv = _client().get_model_version(MODEL, version)
    return {(r.data.tags[TAG_EVAL_LABEL], r.data.tags[TAG_DOMAIN]): r.info.run_id
            for r in stage_runs(mv.tags[TAG_LIFECYCLE_RUN]) if r.data.tags.get(TAG_STAGE) == "eval"}


# ---- reading the registry ------------------------------------------------------------------

def test_second_run_meets_the_champion_and_the_gate_decides(flow_registry):
    """Was: the second run failed in the report ('version ' + int) after registering v2 (sqlite)."""
    first, second = flow_registry["states"]
    assert first.is_completed(), first.message
    assert second.is_completed(), second.message
    r1, r2 = first.result(), second.result()
    assert (r1["registered"]["version"], r1["registered"]["alias"]) == ("1", "champion")
    assert r2["champion_before"] == "1" and r2["registered"]["version"] == "2"
    assert "Champion before this run: version 1" in r2["report"]
    # identical models: every per-sample delta is 0, so no domain regresses; a tie keeps the champion
    assert r2["after"] == r1["after"]
    gate = r2["gate"]
    assert gate["regressed"] == [] and set(gate["p_values"]) == set(DOMAINS)
    assert all(p == pytest.approx(1.0) for p in gate["p_values"].values()) and not gate["passed"]
    assert "tie keeps the champion" in gate["reason"] and r2["registered"]["alias"] == "candidate"
    for r in (r1, r2):
        assert _client().get_run(r["lifecycle_run_id"]).info.status == "FINISHED"


def test_the_second_run_records_the_first_runs_base_eval_instead_of_computing_it(flow_registry):
    """The same base model, data, eval settings and code: the second run's eval-base starts no job; its eval runs
    carry the first run's results (per-sample rewards included) and name the runs that computed them."""
    from temper.core.tag_names import TAG_EVAL_REUSED_FROM
    from temper.registry.samples import eval_samples

    first, second = _eval_runs("1"), _eval_runs("2")
    for d in DOMAINS:
        computed, reused = _client().get_run(first[("base", d)]), _client().get_run(second[("base", d)])
        assert TAG_EVAL_REUSED_FROM not in computed.data.tags
        assert reused.data.tags[TAG_EVAL_REUSED_FROM] == computed.info.run_id
        assert reused.data.metrics["mean_reward"] == computed.data.metrics["mean_reward"]
        assert eval_samples(reused.info.run_id, d) == eval_samples(computed.info.run_id, d)
        for v in (first, second):  # candidates are always evaluated
            assert TAG_EVAL_REUSED_FROM not in _client().get_run(v[("candidate", d)]).data.tags
    (task_run,) = [r for r in _task_runs(flow_registry["states"][1]) if r.name == "eval-base"]
    assert any("2 of 2 domain(s) reused" in line for line in _logs(task_run.id))  # and so no eval job started


def test_version_samples_are_the_candidates_not_the_base_models(flow_registry):
    """Was: the base model's eval/<domain>.jsonl (same lifecycle run) could be read as the version's."""
    from temper.registry.samples import eval_samples, version_samples

    differs = 0
    for v in ("1", "2"):
        mv = _client().get_model_version(MODEL, v)
        runs = _eval_runs(v)
        samples = version_samples(mv)
        assert set(samples) == set(DOMAINS)
        for d in DOMAINS:
            assert samples[d] == eval_samples(runs[("candidate", d)], d)
            assert _mean(samples[d]) == pytest.approx(float(mv.tags[EVAL_TAG.format(domain=d, metric="mean_reward")]))
            differs += eval_samples(runs[("base", d)], d) != samples[d]
    assert differs, "SFT changed no eval answer: this test could not tell base from candidate"


def test_compare_of_two_identical_runs_finds_no_difference(flow_registry, capsys):
    """Was: 'v1 better, 95% CI [-0.234, -0.016]' when one side's samples were the base model's."""
    code, out, err = cli(capsys, "models", "compare", MODEL, "1", "2", "--json", "--no-log")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["domain"] for r in rows] == DOMAINS
    for r in rows:
        iv = r["interval"]
        assert iv["paired"] and (iv["delta"], iv["lo"], iv["hi"]) == pytest.approx((0.0, 0.0, 0.0)) and iv["n_a"] == 16
        assert r["hint"] == "no significant difference (95% CI [+0.000, +0.000])"


def test_lineage_graph_draws_only_the_versions_own_evals(flow_registry, capsys):
    """Was: the base model's eval runs drawn as evaluations of the GRPO output, with the candidate's numbers."""
    code, out, err = cli(capsys, "lineage", f"{MODEL}/2", "--format", "mermaid", "--no-attach")
    assert code == 0, err
    runs = _eval_runs("2")
    mv = _client().get_model_version(MODEL, "2")
    for d in DOMAINS:
        assert f"run_{runs[('candidate', d)]}" in out
        assert f"run_{runs[('base', d)]}" not in out
        reward = float(mv.tags[EVAL_TAG.format(domain=d, metric="mean_reward")])
        assert f"eval {d}<br/>mean_reward={reward:.3f}" in out
    assert out.count("eval arithmetic") == 1 and out.count("eval multiplication") == 1


def test_models_list_shows_the_aliases(flow_registry, capsys):
    """Was: 'aliases: []' on every version (sqlite: alias targets are ints)."""
    code, out, err = cli(capsys, "models", "list", MODEL, "--json")
    assert code == 0, err
    assert {v["version"]: v["aliases"] for v in json.loads(out)} == {"1": ["champion"], "2": ["candidate"]}
    code, out, _ = cli(capsys, "models", "list", MODEL)
    assert "\nv1 @champion  created" in out and "\nv2 @candidate  created" in out


def test_promoting_a_missing_version_is_one_clear_line(flow_registry, capsys):
    """Was: a TypeError traceback (sqlite: joining int version numbers into the message)."""
    code, out, err = cli(capsys, "models", "promote", MODEL, "9", "--reason", "x")
    assert code == 1 and out == ""
    assert err == f"temper: error: {MODEL}: no version 9 (versions: 1, 2)\n"


# ---- moving aliases (order matters from here) ----------------------------------------------

def test_promoting_the_holder_changes_nothing_and_records_nothing(flow_registry, capsys):
    """Was: an audit event for a move that did not happen (sqlite: '1' != 1)."""
    from temper.registry.aliases import audit_trail

    before = audit_trail(MODEL)
    code, out, err = cli(capsys, "models", "promote", MODEL, "champion", "--reason", "again")
    assert code == 0, err
    assert out.strip() == f"{MODEL}@champion already on v1; nothing changed (no audit event)"
    assert audit_trail(MODEL) == before and len(before) == 1


def test_forced_promote_then_rollback_returns_to_the_flows_champion(flow_registry, capsys):
    """Was: rollback printed 'v2 -> v2' and changed nothing (flow events held '2', promote's 2)."""
    code, out, err = cli(capsys, "models", "promote", MODEL, "2", "--force", "--reason", "x")
    assert code == 0, err
    assert out.startswith(f"{MODEL}@champion: v1 -> v2 (promote #2); gate: FAIL (forced): mean improvement +0.000")
    code, out, err = cli(capsys, "models", "rollback", MODEL, "--reason", "y")
    assert code == 0, err
    assert out.strip() == f"{MODEL}@champion: v2 -> v1 (rollback #3)"
    assert _client().get_model_version_by_alias(MODEL, "champion").version in (1, "1")

    code, out, err = cli(capsys, "models", "history", MODEL)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"{MODEL}@champion: 3 event(s)"
    assert " promote unset -> v1 by " in lines[1] and "(post_training flow): post_training gate: no champion" in lines[1]
    assert " promote FORCED v1 -> v2 by " in lines[2] and lines[2].split(": ", 1)[1].startswith("x  gate: mean")
    assert " rollback v2 -> v1 by " in lines[3] and lines[3].endswith(": y")
    code, out, _ = cli(capsys, "models", "history", MODEL, "--alias", "candidate", "--json")
    assert [(e["seq"], e["version"], e["previous"]) for e in json.loads(out)] == [(1, "2", None)]


# ---- failures after the lifecycle run opened -----------------------------------------------

FAILURES = {  # case -> (the stage that fails, how to make it fail cheaply)
    "train-sft": ("train-sft", dict(base_model="/nonexistent/base-model")),
    "train-grpo": ("train-grpo", dict(base_model="/nonexistent/base-model", sft={"enabled": False})),
    # after the version is created: MLflow refuses an alias like v<N>
    "register": ("register", dict(sft={"enabled": False}, eval={"limit": 4}, promotion={"alias": "v7"})),
    # after the model is logged, before any version: MLflow refuses ':' in a registered model's name
    "register-bad-name": ("register", dict(sft={"enabled": False}, eval={"limit": 4}, model_name="failing:name")),
}


@pytest.fixture(scope="module")
def failing_home(tmp_path_factory, prefect_api):
    from temper.core.settings import get_settings
    from tests.integration.conftest import without_retry_waits

    with pytest.MonkeyPatch.context() as mp:
        without_retry_waits(mp)  # each case fails on every attempt; the attempts are counted below
        _env(mp, tmp_path_factory.mktemp("home-failing"), None)
        assert main(["data", "generate", *(f"--domain={d}" for d in DOMAINS)]) == 0
        yield mp
    get_settings.cache_clear()


@pytest.mark.parametrize("case", list(FAILURES))
def test_any_failure_after_the_lifecycle_run_opens_closes_it_failed_with_a_report(failing_home, case, tmp_path):
    """Was: the lifecycle run stayed RUNNING, with no report, whenever a stage after it failed."""
    from flows.post_training import post_training

    stage, overrides = FAILURES[case]
    state = post_training(_params(**{"model_name": f"failing-{case}", **overrides}), return_state=True)
    assert state.is_failed()
    c = _client()
    experiment_id = c.get_experiment_by_name("post_training").experiment_id
    runs = c.search_runs([experiment_id], f"tags.`{TAG_FLOW_RUN}` = '{state.state_details.flow_run_id}'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FAILED"
    assert run.data.tags[TAG_FAILED_STAGE].startswith(stage)
    report = open(c.download_artifacts(run.info.run_id, "report.md", str(tmp_path))).read()
    assert report.startswith(f"# post_training {run.info.run_name}: FAILED")
    assert f"## Failed\n\n{stage}" in report
    if stage == "register":
        # Was: each of the task's 4 attempts logged the model again (and, past the version, registered
        # another version), leaving unlinked logged models behind. One of each per lifecycle run.
        models = c.search_logged_models([experiment_id], filter_string=f"params.lifecycle_run = '{run.info.run_id}'")
        versions = [mv for mv in c.search_model_versions(f"name = '{overrides.get('model_name', f'failing-{case}')}'")
                    if mv.tags.get(TAG_LIFECYCLE_RUN) == run.info.run_id] if case == "register" else []
        assert [str(m.status.name if hasattr(m.status, "name") else m.status) for m in models] == ["READY"]
        assert len(versions) == (1 if case == "register" else 0)
        assert all(mv.source == f"models:/{models[0].model_id}" for mv in versions)  # the version's model is that one


def test_a_misspelt_eval_domain_fails_before_any_training(failing_home):
    """Was: the chosen eval suite was resolved after SFT and GRPO had run: a typo there cost the whole training
    and failed the lifecycle run at its end. Now it fails with the catalog's lookup, before any run is opened."""
    from flows.post_training import post_training

    state = post_training(_params(model_name="failing-eval-suite", eval={"domains": ["no-such-domain"], "limit": 4}),
                          return_state=True)
    assert state.is_failed() and "no-such-domain" in (state.message or ""), state.message
    c = _client()
    experiment = c.get_experiment_by_name("post_training")
    runs = c.search_runs([experiment.experiment_id], f"tags.`{TAG_FLOW_RUN}` = '{state.state_details.flow_run_id}'") \
        if experiment else []
    assert runs == [] and not c.search_registered_models("name = 'failing-eval-suite'")
