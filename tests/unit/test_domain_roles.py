"""Domain roles: eval-only (held-out benchmark) domains are evaluated, never trained on."""

from pathlib import Path

import pytest
import yaml

from temper.data.catalog import load_catalog, refuse_eval_only, select_domains, split_by_role
from temper.core.errors import CatalogError
from temper.core.settings import Settings
from temper.training.config import TrainConfig
from temper.training.run import load_domains

REPO = Path(__file__).resolve().parents[2]


def _catalog(tmp_path: Path) -> Path:
    """arithmetic (both) + a copy of it marked eval-only, in a throwaway catalog directory."""
    base = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "arithmetic.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump({**base, "name": "bench", "role": "eval"}))
    return tmp_path


def test_starter_domains_are_both_and_public_benchmarks_eval_only():
    catalog = load_catalog(REPO / "domains")
    for name in ("arithmetic", "multiplication", "python_functions", "invoice_extraction", "tool_calls", "shell_tasks"):
        assert catalog[name].role == "both", name
    public = ["humaneval", "nl2bash", "bfcl_simple_python", "bfcl_multiple", "bfcl_parallel", "bfcl_parallel_multiple"]
    assert {n: catalog[n].role for n in public} == dict.fromkeys(public, "eval")


def test_bad_role_names_the_file_and_field(tmp_path):
    base = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())
    (tmp_path / "x.yaml").write_text(yaml.safe_dump({**base, "role": "test"}))
    with pytest.raises(CatalogError, match=r"x\.yaml.*role"):
        load_catalog(tmp_path)


def test_refuse_eval_only_names_the_domain(tmp_path):
    catalog = load_catalog(_catalog(tmp_path))
    refuse_eval_only(select_domains(catalog, ["arithmetic"]), "run r")  # fine
    with pytest.raises(CatalogError, match=r"run r: domain\(s\) bench have role 'eval'"):
        refuse_eval_only(select_domains(catalog, ["*"]), "run r")


def test_training_run_refuses_an_eval_only_domain_by_name_or_glob(tmp_path):
    cat = _catalog(tmp_path / "cat")
    settings = Settings(home=tmp_path / "home", storage_root=str(tmp_path / "store"), catalog_dir=cat)
    for pattern in (["bench"], ["*"], ["arithmetic", "be*"]):
        cfg = TrainConfig(mode="grpo", run_name="r1", base_model="x", domains=pattern, output_dir=str(tmp_path / "o"))
        with pytest.raises(CatalogError, match="bench have role 'eval'"):
            load_domains(cfg, settings)


def test_training_stage_refuses_before_launching_a_job(tmp_path, monkeypatch):
    from tasks.training import refuse_eval_only_domains

    from temper.core.settings import get_settings

    monkeypatch.setenv("TEMPER_CATALOG_DIR", str(_catalog(tmp_path)))
    get_settings.cache_clear()
    try:
        refuse_eval_only_domains(["arithmetic"])
        with pytest.raises(CatalogError, match="training stage: domain\\(s\\) bench"):
            refuse_eval_only_domains(["arithmetic", "bench"])
    finally:
        get_settings.cache_clear()


def test_post_training_split_trains_trainable_and_evaluates_eval_only():
    roles = {"a": "both", "t": "train", "h": "eval"}
    assert split_by_role(["a", "h", "t"], roles) == (["a", "t"], ["a", "h"])
    with pytest.raises(CatalogError, match="no trainable domain among h"):
        split_by_role(["h"], roles)


def test_resolve_domains_carries_the_role_to_the_flow(tmp_path, monkeypatch):
    from tasks.data import resolve_domains

    refs = resolve_domains.fn(["*"], str(_catalog(tmp_path / "cat")))
    assert {r.name: r.role for r in refs} == {"arithmetic": "both", "bench": "eval"}
