"""Domain packs: expansion of the shipped reasoning-gym pack, its speed, and bad pack input."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from temper.data.catalog import load_catalog
from temper.core.errors import CatalogError
from temper.data.packs import contract_for

REPO = Path(__file__).resolve().parents[2]
PACK = yaml.safe_load((REPO / "domains" / "packs" / "reasoning_gym.yaml").read_text())


def write(d: Path, name: str, data) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def small(**over):
    return {**PACK, "tasks": ["leg_counting", "basic_arithmetic"], **over}


def test_shipped_pack_expands_to_at_least_300_valid_domains():
    catalog = load_catalog(REPO / "domains")
    packed = [d for d in catalog.values() if d._pack == "rg"]
    assert len(packed) >= 300
    for d in packed:
        assert d.name == f"rg-{d.dataset.generator_params['task']}-{d.dataset.generator_params['tier']}"
        assert d.verifier.family == "reasoning_gym" and d.dataset.generator == "reasoning_gym"
        contract = contract_for(d, {})
        assert contract.name == d.name == d.contract and contract.min_rows == d.dataset.rows
        assert contract.columns["task"].allowed == [d.dataset.generator_params["task"]]
        assert d.dataset_uri("/s") == f"/s/datasets/packs/rg/{d.name}.jsonl"
    names = {d.name for d in packed}
    assert "rg-leg_counting-easy" in names and "rg-leg_counting-expert" in names
    # excluded tasks and tiers stay out, each with its reason in the pack
    for key in PACK["exclude"]:
        task, _, tier = key.partition(":")
        assert not any(n.startswith(f"rg-{task}-") and (not tier or n.endswith(f"-{tier}")) for n in names), key
    # single-file domains are untouched by the expansion
    assert catalog["arithmetic"]._pack is None and contract_for(catalog["arithmetic"], {"arithmetic": 1}) == 1


def test_catalog_load_is_fast_and_never_imports_reasoning_gym():
    # CPU time, not wall: the 2-core machine is shared, and waiting for a core is not the catalog's cost
    code = ("import sys, time; from temper.data.catalog import load_catalog; "
            "c = load_catalog('domains'); print(len(c), time.process_time(), 'reasoning_gym' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout.split()
    n, seconds, imported = int(out[0]), float(out[1]), out[2]
    assert n >= 300 and imported == "False"
    assert seconds < 2.0, f"catalog of {n} domains took {seconds:.2f} CPU-s (interpreter start and imports included)"
    t = time.process_time()
    load_catalog(REPO / "domains")  # warm: the expansion itself
    assert time.process_time() - t < 1.0


def test_overrides_and_tier_filtering(tmp_path):
    write(tmp_path, "p", small(tiers=["easy", "hard"], overrides={"leg_counting": {"rows": 50, "sampling_ratio": 0.5}}))
    cat = load_catalog(tmp_path)
    assert sorted(cat) == ["rg-basic_arithmetic-easy", "rg-basic_arithmetic-hard", "rg-leg_counting-easy",
                           "rg-leg_counting-hard"]
    assert cat["rg-leg_counting-easy"].dataset.rows == 50 and cat["rg-leg_counting-easy"].sampling_ratio == 0.5
    assert contract_for(cat["rg-leg_counting-easy"], {}).max_rows == 50


def test_total_sampling_ratio_fixes_the_packs_weight_in_a_mix(tmp_path):
    over = {"leg_counting": {"sampling_ratio": 3.0}}
    write(tmp_path, "p", small(tiers=["easy", "hard"], overrides=over, total_sampling_ratio=2.0))
    ratios = {n: d.sampling_ratio for n, d in load_catalog(tmp_path).items()}
    assert sum(ratios.values()) == pytest.approx(2.0)
    # shares inside the pack keep their proportions: leg_counting domains weigh 3x basic_arithmetic's
    assert ratios["rg-leg_counting-easy"] == pytest.approx(3 * ratios["rg-basic_arithmetic-hard"])
    assert ratios["rg-basic_arithmetic-easy"] == pytest.approx(2.0 / 8)


def test_task_without_levels_gets_its_default_tier(tmp_path):
    write(tmp_path, "p", small(tasks=["acre"]))
    assert sorted(load_catalog(tmp_path)) == ["rg-acre-default"]


@pytest.mark.parametrize("over, message", [
    ({"tasks": ["leg_countin"]}, r"p\.yaml: task 'leg_countin': field 'tasks': reasoning_gym 0\.1\.25 has no such task"),
    ({"tiers": ["easy", "legendary"]}, r"p\.yaml: field 'tiers': unknown tier 'legendary'"),
    ({"exclude": {"leg_counting": ""}}, r"p\.yaml: field 'exclude': .*needs its reason.*leg_counting"),
    ({"exclude": {"nonsense:easy": "x"}}, r"p\.yaml: task 'nonsense': field 'exclude'"),
    ({"overrides": {"leg_counting": {"tiers": ["default"]}}},
     r"p\.yaml: task 'leg_counting': field 'overrides\.leg_counting\.tiers': no tier 'default'"),
    ({"source_version": "0.1.19"}, r"p\.yaml: field 'source_version': pack is for reasoning_gym 0\.1\.19, installed is 0\.1\.25"),
    ({"source": "gym"}, r"p\.yaml: field 'source': .*unknown pack source 'gym'"),
    ({"rows": 5}, r"p\.yaml: field 'rows'"),
    ({"name_template": "rg-{task}-{level}"}, r"p\.yaml: field 'name_template': unknown placeholder \{level\}"),
    ({"name_template": "RG-{task}-{tier}"}, r"p\.yaml: task 'leg_counting' tier 'easy': field 'name'"),
    ({"verifier": {"family": "telepathy"}}, r"field 'verifier'.*unknown verifier family"),
    ({"contract_template": "nope"}, r"p\.yaml: field 'contract_template': no template"),
])
def test_bad_pack_input_names_file_task_and_field(tmp_path, over, message):
    write(tmp_path, "p", small(**over))
    with pytest.raises(CatalogError, match=message):
        load_catalog(tmp_path)


def test_two_packs_expanding_to_the_same_name_are_rejected(tmp_path):
    write(tmp_path, "a", small())
    write(tmp_path, "b", small(pack="rg2", tasks=["leg_counting"]))
    with pytest.raises(CatalogError, match=r"b\.yaml: task 'leg_counting' expands to domain name "
                                           r"'rg-leg_counting-easy' already defined in .*a\.yaml"):
        load_catalog(tmp_path)


def test_a_domain_file_clashing_with_a_pack_domain_is_rejected(tmp_path):
    single = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())
    write(tmp_path, "a_single", {**single, "name": "rg-leg_counting-easy"})
    write(tmp_path, "b_pack", small())
    with pytest.raises(CatalogError, match=r"b_pack\.yaml: task 'leg_counting' expands to domain name"):
        load_catalog(tmp_path)


def test_bad_contract_template_names_pack_task_and_field(tmp_path, monkeypatch):
    from temper.core.settings import get_settings

    contracts = tmp_path / "contracts"
    (contracts / "templates").mkdir(parents=True)
    tpl = yaml.safe_load((REPO / "data_contracts" / "templates" / "reasoning_gym.yaml").read_text())
    tpl["min_rows"] = "many"
    (contracts / "templates" / "reasoning_gym.yaml").write_text(yaml.safe_dump(tpl))
    monkeypatch.setenv("TEMPER_CONTRACTS_DIR", str(contracts))
    get_settings.cache_clear()
    try:
        write(tmp_path / "cat", "p", small())
        with pytest.raises(CatalogError, match=r"p\.yaml: task 'leg_counting' tier 'easy': contract template "
                                               r"'reasoning_gym': field 'min_rows'"):
            load_catalog(tmp_path / "cat")
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize("edit, field, what", [
    (lambda t: t["rules"][0].update(with_column="tsak"), "rules[0].with_column",
     "no such column 'tsak' (did you mean 'task'?)"),
    (lambda t: t["rules"][0].update(column="entyr"), "rules[0].column", "no such column 'entyr' (did you mean 'entry'?)"),
    (lambda t: t["columns"]["task"].update(allowed=["${tsk}"]), "columns.task.allowed[0]",
     "unknown placeholder ${tsk} (did you mean 'task'?); known: name, pack, task, tier, rows, eval_min, eval_max"),
    (lambda t: t.update(description="tier $tire of ${name}"), "description", "unknown placeholder ${tire}"),
    (lambda t: t["split"].update(eval_fraction_min="${eval_minimum}"), "split.eval_fraction_min",
     "unknown placeholder ${eval_minimum}"),
    (lambda t: t["columns"].update(difficulty={"type": "str"}), "columns.difficulty",
     "no such column; the rows have id, task, tier, question, answer, reference, entry, split"),
    (lambda t: t["split"].update(column="splt"), "split.column", "no such column 'splt' (did you mean 'split'?)"),
])
def test_a_contract_template_mistake_names_the_template_and_field_before_any_data(tmp_path, monkeypatch, edit,
                                                                                  field, what):
    """A misspelt rule column, an unknown placeholder, a column the rows lack: each would fail every row of
    every domain (blamed on the data); instead one line names the template, the field and what is wrong."""
    from temper.core.settings import get_settings

    contracts = tmp_path / "contracts"
    (contracts / "templates").mkdir(parents=True)
    tpl = yaml.safe_load((REPO / "data_contracts" / "templates" / "reasoning_gym.yaml").read_text())
    edit(tpl)
    path = contracts / "templates" / "reasoning_gym.yaml"
    path.write_text(yaml.safe_dump(tpl))
    monkeypatch.setenv("TEMPER_CONTRACTS_DIR", str(contracts))
    get_settings.cache_clear()
    try:
        write(tmp_path / "cat", "p", small())
        with pytest.raises(CatalogError) as e:
            load_catalog(tmp_path / "cat")
    finally:
        get_settings.cache_clear()
    assert str(e.value).startswith(f"{path}: contract template 'reasoning_gym': field '{field}': {what}"), str(e.value)
    assert "\n" not in str(e.value)


def test_the_template_columns_are_the_columns_the_generator_writes():
    """SOURCE_COLUMNS (what a template may check) is what packs_reasoning_gym writes, read from its source
    without importing reasoning_gym: a new column there must be added here too."""
    import ast
    import inspect

    from temper.data import packs_reasoning_gym
    from temper.data.pack_contract import SOURCE_COLUMNS

    tree = ast.parse(inspect.getsource(packs_reasoning_gym.generate_rows))
    (row,) = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "row"]
    assert sorted(k.value for k in row.keys) == sorted(SOURCE_COLUMNS["reasoning_gym"])


def test_domains_list_cli_json_and_pack_filter():
    run = lambda *a: subprocess.run([sys.executable, "-m", "temper.cli", "domains", "list", *a], cwd=REPO,
                                    capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    rows = json.loads(run("--pack", "rg", "--json").stdout)
    assert len(rows) >= 300 and {r["pack"] for r in rows} == {"rg"}
    leg = next(r for r in rows if r["name"] == "rg-leg_counting-easy")
    assert leg == {**leg, "source": "reasoning_gym", "family": "reasoning_gym", "rows": PACK["rows"], "ratio": 1.0}
    everything = json.loads(run("--json").stdout)
    assert len(everything) > len(rows) and abs(sum(r["share"] for r in everything) - 1) < 1e-3
    bad = run("--pack", "nope")
    assert bad.returncode == 1 and "--pack nope: no such pack; packs: rg" in bad.stderr


def test_the_pack_run_is_a_params_file_and_the_same_deployment():
    """configs/params/reasoning-gym.yaml and the post-training-reasoning-gym deployment say the same
    thing, validate as PostTrainingParams, and select every domain of the pack."""
    from flows.deployments import read_entries
    from temper.data.catalog import load_catalog, select_domains
    from temper.lifecycle.params import PostTrainingParams, load_params

    from_file = load_params(str(REPO / "configs/params/reasoning-gym.yaml"))
    (entry,) = [e for e in read_entries() if e.name == "post-training-reasoning-gym"]
    assert PostTrainingParams.model_validate(entry.parameters["params"]) == from_file
    catalog = load_catalog(REPO / "domains")
    chosen = {d.name for d in select_domains(catalog, from_file.domains)}
    assert chosen == {n for n, d in catalog.items() if d._pack} and len(chosen) >= 300


def test_a_pack_whose_package_is_missing_makes_only_its_own_domains_unavailable(monkeypatch):
    from temper.data import packs
    from temper.data.catalog import select_domains

    monkeypatch.setattr(packs, "_installed_version", lambda distribution: None)  # as on a machine without it
    catalog = load_catalog(REPO / "domains")
    assert "arithmetic" in catalog and not any(name.startswith("rg-") for name in catalog)
    assert len(catalog.unavailable) >= 300 and "rg-leg_counting-easy" in catalog.unavailable
    # every other domain still works: named, globbed, or all of them
    assert [d.name for d in select_domains(catalog, ["arithmetic", "multiplication"])] == ["arithmetic", "multiplication"]
    assert "arithmetic" in [d.name for d in select_domains(catalog, None)]
    # asking for one of its domains says which package it needs, in one line
    with pytest.raises(CatalogError, match=r"domain rg-leg_counting-easy: reasoning-gym is not installed "
                                           r"\(pack .*reasoning_gym.yaml; pip install reasoning-gym==0\.1\.25\)"):
        select_domains(catalog, ["rg-leg_counting-easy"])
    with pytest.raises(CatalogError, match=r"\(and \d+ more\): reasoning-gym is not installed"):
        select_domains(catalog, ["arithmetic", "rg-*"])


def test_the_real_model_run_is_a_params_file_and_the_same_deployment():
    """configs/params/smollm2-multidomain.yaml and the post-training-smollm2 deployment say the same thing: at
    least 64 trained and 8 held-out reasoning-gym domains of the catalog, disjoint, on the named SmolLM2 base."""
    from flows.deployments import read_entries
    from temper.data.catalog import load_catalog, select_domains
    from temper.lifecycle.params import PostTrainingParams, load_params

    from_file = load_params(str(REPO / "configs/params/smollm2-multidomain.yaml"))
    (entry,) = [e for e in read_entries() if e.name == "post-training-smollm2"]
    assert PostTrainingParams.model_validate(entry.parameters["params"]) == from_file
    catalog = load_catalog(REPO / "domains")
    trained = {d.name for d in select_domains(catalog, from_file.domains)}
    held = {d.name for d in select_domains(catalog, from_file.held_out)}
    assert len(trained) >= 64 and len(held) >= 8 and not trained & held
    assert from_file.base_model == "smollm2" and from_file.eval.limit >= 32
