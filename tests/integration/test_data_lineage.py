"""`temper data` and lineage against real servers: MLflow tracking and moto S3 on 127.0.0.1."""

from __future__ import annotations

import json

from temper.cli import main
from temper.core.tag_names import TAG_DATA_VALIDATION, TAG_GIT


def test_generate_validate_and_lineage_round_trip(tracked, capsys):
    assert main(["data", "generate", "--domain", "arithmetic", "--domain", "tool_calls"]) == 0
    capsys.readouterr()
    assert main(["data", "validate", "--domain", "arithmetic", "--domain", "tool_calls", "--json", "--track"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["success"] and {d["domain"] for d in report["domains"]} == {"arithmetic", "tool_calls"}

    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracked)
    exp = client.get_experiment_by_name("validate_data")
    run = client.search_runs([exp.experiment_id], order_by=["start_time DESC"], max_results=1)[0]
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"arithmetic", "tool_calls"}
    assert len(inputs["arithmetic"].digest) == 32
    assert "arithmetic.jsonl" in inputs["arithmetic"].source
    assert run.data.tags[TAG_DATA_VALIDATION] == "pass"
    assert run.data.tags[TAG_GIT]
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "validation")]
    assert "validation/report.json" in artifacts and "validation/data_docs" in artifacts

    capsys.readouterr()
    assert main(["lineage", run.info.run_id]) == 0
    out = capsys.readouterr().out
    assert f"dataset ds_arithmetic_{inputs['arithmetic'].digest[:12]}: arithmetic, digest " in out
    assert f"digest={inputs['arithmetic'].digest}" in out and "validation validation_" in out
    assert mlflow.get_tracking_uri() == tracked


def test_violation_fails_with_named_expectation_then_passes_when_fixed(temper_home, capsys):
    from infra.storage import write_bytes_atomic
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.datasets import read_dataset, serialize_dataset

    assert main(["data", "generate", "--domain", "arithmetic"]) == 0
    domain = load_catalog(get_settings().catalog_dir)["arithmetic"]
    uri = domain.dataset_uri(get_settings().resolved_storage_root)
    good = read_dataset(domain)
    bad = good.copy()
    bad.loc[10, "answer"] = "ten"
    write_bytes_atomic(uri, serialize_dataset(bad, "jsonl"))
    capsys.readouterr()
    assert main(["data", "validate", "--domain", "arithmetic"]) == 1
    out = capsys.readouterr().out
    assert "FAIL arithmetic" in out
    assert "expect_column_values_to_be_in_set [rule:parses_as_number] column=answer unexpected=1" in out
    assert "'ten'" in out
    write_bytes_atomic(uri, serialize_dataset(good, "jsonl"))
    assert main(["data", "validate", "--domain", "arithmetic"]) == 0
    assert (temper_home / "store" / "validation" / "data_docs" / "index.html").exists()


def test_missing_dataset_is_reported_per_domain(temper_home, capsys):
    assert main(["data", "validate", "--domain", "arithmetic", "--no-docs"]) == 1
    out = capsys.readouterr().out
    assert "FAIL arithmetic" in out and "does not exist" in out and "temper data generate" in out


def test_datasets_on_s3_through_s3fs(temper_home, s3_env, capsys):
    import boto3

    from temper.core.settings import get_settings

    assert main(["data", "generate", "--domain", "invoice_extraction"]) == 0
    s3 = boto3.client("s3", endpoint_url=get_settings().s3_endpoint_url, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_env)["Contents"]]
    assert "temper/datasets/invoice_extraction.jsonl" in keys
    assert main(["data", "validate", "--domain", "invoice_extraction"]) == 0
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_env)["Contents"]]
    assert "temper/validation/data_docs/index.html" in keys


def test_unreachable_s3_endpoint_is_one_clear_line(temper_home, monkeypatch, capsys):
    from temper.core.settings import get_settings
    from tests.integration.conftest import free_port

    monkeypatch.setenv("TEMPER_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("TEMPER_STORAGE_ROOT", "s3://nowhere/x")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    get_settings.cache_clear()
    assert main(["data", "generate", "--domain", "arithmetic"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("temper: error: cannot reach store for s3://nowhere/x")


def test_unreachable_tracking_server_writes_nothing(temper_home, monkeypatch, capsys):
    from temper.core.settings import get_settings
    from tests.integration.conftest import free_port

    assert main(["data", "generate", "--domain", "arithmetic"]) == 0
    monkeypatch.setenv("TEMPER_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    get_settings.cache_clear()
    assert main(["data", "validate", "--domain", "arithmetic", "--track", "--no-docs"]) == 1
    assert "MLflow tracking server" in capsys.readouterr().err
    assert not (temper_home / "store" / "validation").exists()


def test_lineage_of_unknown_model_is_clear(tracked, capsys):
    assert main(["lineage", "no-such-model@champion"]) == 1
    assert "no-such-model@champion: not found" in capsys.readouterr().err
