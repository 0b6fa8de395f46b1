import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from temper.data.catalog import load_catalog, load_domain, select_domains
from temper.core.errors import CatalogError

REPO = Path(__file__).resolve().parents[2]
GOOD = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())


def write(tmp_path: Path, name: str, data) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def test_shipped_catalog_loads_all_starter_domains():
    catalog = load_catalog(REPO / "domains")
    assert {"arithmetic", "python_functions", "invoice_extraction", "tool_calls", "shell_tasks"} <= set(catalog)
    assert catalog["python_functions"].sandbox_profile == "python"


def test_loading_the_catalog_imports_no_verifier_judge_or_sandbox():
    """A Domain checks its verifier family by name (temper.data.verifier_families): loading every shipped
    domain, packs included, imports none of the families, nor the judges and sandbox they use."""
    code = ("import sys; from temper.data.catalog import load_catalog; load_catalog('domains'); "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['temper', 'verifiers'], "
            "['temper', 'judges'], ['infra', 'sandbox'])))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = write(tmp_path, "bad", "name: x\ndescription: [unclosed\n")
    with pytest.raises(CatalogError, match=r"bad\.yaml.*line \d+.*malformed YAML"):
        load_domain(p)


def test_bad_field_names_file_field_and_reason(tmp_path):
    p = write(tmp_path, "neg", {**GOOD, "reward_weight": -1})
    with pytest.raises(CatalogError, match=r"neg\.yaml: field 'reward_weight': .*greater than or equal to 0"):
        load_domain(p)


def test_unknown_verifier_family_is_rejected(tmp_path):
    p = write(tmp_path, "fam", {**GOOD, "verifier": {"family": "telepathy"}})
    with pytest.raises(CatalogError, match=r"fam\.yaml: field 'verifier'.*unknown verifier family 'telepathy'"):
        load_domain(p)


def test_unknown_field_is_rejected(tmp_path):
    p = write(tmp_path, "typo", {**GOOD, "sampling_ration": 0.3})
    with pytest.raises(CatalogError, match="sampling_ration"):
        load_domain(p)


def test_duplicate_names_are_rejected(tmp_path):
    write(tmp_path, "a", GOOD)
    write(tmp_path, "b", GOOD)
    with pytest.raises(CatalogError, match="already defined"):
        load_catalog(tmp_path)


def test_300_domains_load_quickly(tmp_path):
    for i in range(300):
        write(tmp_path, f"d{i}", {**GOOD, "name": f"arith_{i:03d}"})
    t = time.perf_counter()
    catalog = load_catalog(tmp_path)
    elapsed = time.perf_counter() - t
    assert len(catalog) == 300
    assert elapsed < 10, f"loading 300 domains took {elapsed:.1f}s"


def test_select_by_glob_and_unknown_pattern():
    catalog = load_catalog(REPO / "domains")
    assert [d.name for d in select_domains(catalog, ["tool*", "arith*"])] == ["arithmetic", "tool_calls"]
    with pytest.raises(CatalogError, match="no domain matches nope"):
        select_domains(catalog, ["nope"])


def test_prompt_renders_from_record():
    d = load_catalog(REPO / "domains")["arithmetic"]
    assert d.render_prompt({"question": "2 + 3"}) == "Q: 2 + 3 =\nA:"
    with pytest.raises(CatalogError, match="needs column 'question'"):
        d.render_prompt({"q": "x"})


def test_a_bad_json_line_is_reported_at_its_own_line_number(temper_home, capsys):
    """`temper data validate` over a dataset whose line 201 is broken says line 201, not line 1."""
    from temper.data.catalog import load_catalog
    from temper.cli import main
    from temper.data.generators import generate_domain_dataset
    from temper.core.settings import get_settings

    domain = load_catalog(get_settings().catalog_dir)["arithmetic"]
    uri, _, _ = generate_domain_dataset(domain)
    lines = open(uri).read().splitlines()
    lines[200] = lines[200][:-1]  # drop the closing brace of line 201
    open(uri, "w").write("\n".join(lines) + "\n")
    assert main(["data", "validate", "--domain", "arithmetic", "--no-docs"]) == 1
    out = capsys.readouterr().out
    assert "is not valid jsonl: line 201 column" in out, out


def test_validate_reports_a_prompt_column_the_contract_does_not_declare(temper_home, tmp_path, capsys):
    import shutil

    import yaml

    from temper.cli import main

    catalog = tmp_path / "catalog"
    shutil.copytree(REPO / "domains", catalog)
    doc = yaml.safe_load((catalog / "arithmetic.yaml").read_text())
    doc["prompt_template"] = "Q: {question} ({hint}) =\nA:"
    (catalog / "arithmetic.yaml").write_text(yaml.safe_dump(doc))
    assert main(["data", "generate", "--catalog", str(catalog), "--domain", "arithmetic"]) == 0
    assert main(["data", "validate", "--catalog", str(catalog), "--domain", "arithmetic", "--no-docs"]) == 1
    out = capsys.readouterr().out
    assert "FAIL arithmetic" in out and "prompt_template uses column(s) hint that contract arithmetic" in out


@pytest.mark.parametrize("text, message", [
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, n in zip("abcdefgh", "bcdefghi")), "expands to more than 100000 values"),
    ("name: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("name: x\n" + "# padding\n" * 200_000, "more than the 1048576 a config may have"),
])
def test_hostile_yaml_is_refused_with_one_line(tmp_path, text, message):
    """A billion-laughs document, a deeply nested one, a huge one: a CatalogError naming the file."""
    from temper.data.catalog import load_domain

    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=message) as e:
        load_domain(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
