"""Contracts run through Great Expectations for real (ephemeral context, no server)."""

import json
from pathlib import Path

import pytest

from data_contracts.model import load_contract, load_contracts
from data_contracts.runner import GXRunner
from temper.core.errors import ContractError
from temper.data.generators import generate

CONTRACTS = Path(__file__).resolve().parents[2] / "data_contracts"


@pytest.fixture(scope="module")
def runner():
    return GXRunner()


def check(runner, contract, frame):
    return runner.validate(contract.name, contract, frame, dataset_uri="mem://x", digest="0" * 64)


@pytest.mark.parametrize("name", ["arithmetic", "python_functions", "invoice_extraction", "tool_calls", "shell_tasks",
                                  "file_tasks", "ledger_tasks"])
def test_generated_starter_data_passes_its_contract(runner, name):
    contract = load_contracts(CONTRACTS)[name]
    report = check(runner, contract, generate(name, 300, 0, 0.1, {}))
    assert report.success, report.failures


def failures_by_check(report):
    return {(f.check, f.column): f for f in report.failures}


def test_numeric_answer_violation_is_named_and_fixing_it_passes(runner):
    contract = load_contracts(CONTRACTS)["arithmetic"]
    df = generate("arithmetic", 300, 0, 0.1, {})
    df.loc[7, "answer"] = "seven"
    report = check(runner, contract, df)
    assert not report.success
    f = failures_by_check(report)[("rule:parses_as_number", "answer")]
    assert f.unexpected_count == 1 and f.sample_values == ["seven"]
    df.loc[7, "answer"] = "7"
    assert check(runner, contract, df).success


def test_duplicate_ids_null_and_split_values(runner):
    contract = load_contracts(CONTRACTS)["arithmetic"]
    df = generate("arithmetic", 300, 0, 0.1, {})
    df.loc[1, "id"] = df.loc[0, "id"]
    df.loc[2, "split"] = "test"
    df.loc[3, "question"] = None
    fails = failures_by_check(check(runner, contract, df))
    assert fails[("unique", "id")].unexpected_count == 2
    assert fails[("allowed_values", "split")].sample_values == ["test"]
    assert fails[("not_null", "question")].unexpected_count == 1


def test_split_ratio_out_of_bounds(runner):
    contract = load_contracts(CONTRACTS)["arithmetic"]
    df = generate("arithmetic", 300, 0, 0.5, {})
    fails = failures_by_check(check(runner, contract, df))
    assert ("split_ratio", "split") in fails
    assert 0.4 < fails[("split_ratio", "split")].observed < 0.6


def test_tool_ground_truth_must_name_offered_function(runner):
    contract = load_contracts(CONTRACTS)["tool_calls"]
    df = generate("tool_calls", 100, 0, 0.1, {})
    df.loc[4, "ground_truth"] = '[{"launch_rocket": {"x": [1]}}]'
    f = failures_by_check(check(runner, contract, df))[("rule:calls_offered_functions", "ground_truth")]
    assert f.unexpected_count == 1 and "launch_rocket" in f.sample_values[0]


def test_multistep_task_whose_end_state_is_its_start_or_whose_reference_never_ends_fails(runner):
    contract = load_contracts(CONTRACTS)["ledger_tasks"]
    df = generate("ledger_tasks", 60, 0, 0.1, {})
    df.loc[3, "end_accounts"] = df.loc[3, "start_accounts"]  # doing nothing would pass
    df.loc[5, "reference"] = '["<call>{}</call>"]'  # a reference that never says done
    failed = failures_by_check(check(runner, contract, df))
    assert {c for c, _ in failed} >= {"rule:json_state_differs", "rule:episode_turns"}


@pytest.mark.parametrize("tier", [{"modules": 2, "bugs": 1}, {"modules": 4, "bugs": 2, "cross_module": True}])
def test_repair_projects_pass_their_contract_and_a_broken_one_is_named(runner, tier):
    contract = load_contracts(CONTRACTS)["repair_tasks"]
    df = generate("repair_tasks", 40, 0, 0.1, tier)
    assert check(runner, contract, df).success
    df.loc[2, "hidden_tests"] = "[]"  # nothing would judge the episode
    files = json.loads(df.loc[4, "start_files"])
    df.loc[4, "start_files"] = json.dumps({k: v for k, v in files.items() if not k.startswith("tests/")})
    df.loc[6, "start_files"] = json.dumps({**files, "../outside.py": ""})  # written outside the work dir
    failed = failures_by_check(check(runner, contract, df))
    assert failed[("rule:hidden_cases", "hidden_tests")].unexpected_count == 1
    assert failed[("rule:project_files", "start_files")].unexpected_count == 2


def test_code_tests_must_parse(runner):
    contract = load_contracts(CONTRACTS)["python_functions"]
    df = generate("python_functions", 100, 0, 0.1, {})
    df.loc[0, "test"] = "def check(candidate):\n    assert candidate(1) ==\n"
    df.loc[1, "test"] = "def check(candidate):\n    return None  # no asserts\n"
    f = failures_by_check(check(runner, contract, df))[("rule:defines_check", "test")]
    assert f.unexpected_count == 2


def test_missing_column_is_reported(runner):
    contract = load_contracts(CONTRACTS)["arithmetic"]
    df = generate("arithmetic", 100, 0, 0.1, {}).drop(columns=["answer"])
    fails = failures_by_check(check(runner, contract, df))
    assert ("required", "answer") in fails and ("rule:parses_as_number", "answer") in fails


def test_unknown_rule_in_contract_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: c\ncolumns: {id: {type: str}}\nrules: [{rule: vibes, column: id}]\n")
    with pytest.raises(ContractError, match=r"c\.yaml.*unknown rule 'vibes'"):
        load_contract(p)


@pytest.mark.parametrize("rule, message", [
    ("{rule: json_state_differs, column: end, with_column: strat}",
     "rules[0].with_column: 'strat' is not a column of the contract (did you mean 'start'?); columns: id, start, end"),
    ("{rule: valid_json, column: ned}", "rules[0].column: 'ned' is not a column of the contract (did you mean 'end'?)"),
    ("{rule: valid_json, column: notes}", "rules[0].column: 'notes' is not a column of the contract; columns: id, start, end"),
])
def test_a_rule_over_a_column_the_contract_does_not_declare_is_refused_at_load(tmp_path, rule, message):
    """Else every row fails that rule, which reads as bad data."""
    p = tmp_path / "c.yaml"
    p.write_text(f"name: c\ncolumns: {{id: {{type: str}}, start: {{type: str}}, end: {{type: str}}}}\nrules: [{rule}]\n")
    with pytest.raises(ContractError) as e:
        load_contract(p)
    assert str(e.value).startswith(f"{p}: ") and message in str(e.value) and "\n" not in str(e.value)


def _one_suite_per_domain_summary(contract, frame):
    """The runner as it was before its fast path: a fresh context, suite, asset and validation
    definition for the domain, and every expectation run with SUMMARY details."""
    import great_expectations as gx

    from data_contracts.compiler import compile_suite, prepare_frame

    ctx = gx.get_context(mode="ephemeral")
    prepared = prepare_frame(contract, frame)
    suite = ctx.suites.add(compile_suite(contract, name="reference"))
    batch = ctx.data_sources.add_pandas("ref").add_dataframe_asset(name="ref").add_batch_definition_whole_dataframe("ref")
    vd = ctx.validation_definitions.add(gx.ValidationDefinition(name="reference", data=batch, suite=suite))
    result = vd.run(batch_parameters={"dataframe": prepared},
                    result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5})
    return bool(result.success), len(result.results), [GXRunner._failure(r, prepared) for r in result.results
                                                        if not r.success]


def test_fast_path_reports_exactly_what_a_fresh_summary_run_reports():
    """One suite per contract, a pass/fail screen and details only for failing domains (the fast
    path) must not change a report: same pass/fail, same failing checks, counts and samples."""
    contract = load_contracts(CONTRACTS)["arithmetic"]
    base = generate("arithmetic", 300, 0, 0.1, {})
    broken = {"clean": base.copy()}
    df = base.copy()
    df.loc[3, "answer"], df.loc[9, "answer"] = "forty-two", "x"
    broken["rule"] = df
    df = base.copy()
    df.loc[1, "id"], df.loc[2, "split"], df.loc[5, "question"] = df.loc[0, "id"], "test", None
    broken["unique+allowed+null"] = df
    df = base.copy()
    df["split"] = "eval"
    broken["split ratio"] = df
    broken["missing column"] = base.drop(columns=["reference"])
    df = base.copy()
    df.loc[4, "question"], df.loc[6, "question"] = "1 ^ 2", "x" * 80
    broken["regex+length"] = df
    df = base.copy()
    df["answer"] = df["answer"].astype(object)
    df.loc[7, "answer"] = 7
    broken["type"] = df
    screened, detailed = GXRunner(screen=True), GXRunner(screen=False)  # each reused across domains, as at scale
    for _ in range(2):  # a second round reuses the cached suite and definition
        for name, frame in broken.items():
            success, n, failures = _one_suite_per_domain_summary(contract, frame)
            assert (name == "clean") == success
            for runner in (screened, detailed):
                report = check(runner, contract, frame)
                assert (report.success, report.expectations, report.failures) == (success, n, failures), name
