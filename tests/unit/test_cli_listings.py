"""What the listing commands print, typed and short: `domains list` shares, `models list --json` types,
`models history`, and the unknown-domain message (the closest names, not the whole catalog)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from temper.core.errors import CatalogError
from temper.core.tag_names import EVAL_TAG, TAG_GATE_PASSED
from temper.data.catalog import load_catalog, select_domains
from tests.conftest import REPO


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(REPO / "domains")


@pytest.mark.parametrize("typo, near", [
    ("arithmetc", "arithmetic"),                          # a one-file domain
    ("rg-leg_countng-easy", "rg-leg_counting-easy"),      # a pack domain
    ("rg-spiral-matrix-*", "rg-spiral_matrix-"),          # a glob
    ("humaneval_plus", "humaneval"),
])
def test_an_unknown_domain_names_the_closest_few_not_the_whole_catalog(catalog, typo, near):
    with pytest.raises(CatalogError) as e:
        select_domains(catalog, ["arithmetic", typo])
    msg = str(e.value)
    assert msg.startswith(f"no domain matches {typo} (closest: ") and near in msg and "\n" not in msg
    listed = msg.split("(closest: ")[1].split(")")[0].split(", ")
    assert 1 <= len(listed) <= 5 and all(n in catalog for n in listed)
    assert f"shows all {len(catalog)}" in msg and len(msg) < 400


def test_an_unknown_domain_with_nothing_close_says_so(catalog):
    with pytest.raises(CatalogError, match=r"^no domain matches zzzz \(no close name\); qqqq \(no close name\) "):
        select_domains(catalog, ["zzzz", "qqqq"])


def test_domains_list_share_is_over_trainable_domains_only(catalog, capsys):
    from argparse import Namespace

    from temper.commands.domains import list_domains

    assert list_domains(Namespace(catalog=REPO / "domains", pack=None, json=True)) == 0
    rows = json.loads(capsys.readouterr().out)
    eval_only = [r for r in rows if r["role"] == "eval"]
    assert eval_only and all(r["share"] == 0 for r in eval_only)
    trainable = [r for r in rows if r["role"] != "eval"]
    assert abs(sum(r["share"] for r in trainable) - 1) < 1e-3
    total = sum(r["ratio"] for r in trainable)
    assert all(abs(r["share"] - r["ratio"] / total) < 1e-6 for r in trainable)


@pytest.mark.parametrize("name", ["rg", "reasoning_gym"])
def test_domains_list_pack_by_its_name_or_its_file(capsys, name):
    from argparse import Namespace

    from temper.commands.domains import list_domains

    assert list_domains(Namespace(catalog=REPO / "domains", pack=name, json=True)) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) >= 300 and {r["pack"] for r in rows} == {"rg"}
    with pytest.raises(CatalogError, match=r"^--pack nope: no such pack; packs: rg \(file .*reasoning_gym\.yaml\)$"):
        list_domains(Namespace(catalog=REPO / "domains", pack="nope", json=True))


@pytest.mark.parametrize("tag, typed", [("true", True), ("false", False), ("True", True), (None, None)])
def test_models_list_json_types_gate_passed_as_bool_and_n_as_int(tag, typed):
    from dataclasses import asdict

    from temper.registry.versions import format_versions, summarize

    tags = {EVAL_TAG.format(domain=d, metric=m): v for d, m, v in
            (("arithmetic", "n", "64.0"), ("arithmetic", "mean_reward", "0.5"), ("multiplication", "n", "64"))}
    if tag is not None:
        tags[TAG_GATE_PASSED] = tag
    mv = SimpleNamespace(version="3", tags=tags, creation_timestamp=0, run_id=None)
    row = json.loads(json.dumps(asdict(summarize(mv, ["champion"], []))))
    assert row["gate_passed"] is typed
    assert row["evals"]["arithmetic"] == {"n": 64, "mean_reward": 0.5}
    assert all(type(m["n"]) is int for m in row["evals"].values())
    text = format_versions("m", [summarize(mv, [], [])])
    assert f"gate_passed={'-' if typed is None else str(typed).lower()}" in text and "n=64" in text


def test_history_says_the_gate_once():
    from temper.registry.audit import AuditEvent, format_trail

    flow = AuditEvent(seq=1, action="promote", alias="champion", version="1", previous=None, time="t",
                      reason="post_training gate: no champion yet", by="me (post_training flow)",
                      gate="no champion yet")
    by_hand = AuditEvent(seq=2, action="promote", alias="champion", version="2", previous="1", time="t",
                         reason="looks good", by="me", gate="arithmetic +0.1")
    lines = format_trail("m", "champion", [flow, by_hand]).splitlines()
    assert lines[1].count("no champion yet") == 1
    assert lines[2].endswith("looks good  gate: arithmetic +0.1")  # a gate the reason does not quote is kept


def test_readme_load_and_serve_examples_prompt_as_the_model_was_trained(catalog):
    """The README's pyfunc predict([PROMPT]) and curl inputs: the arithmetic domain's own rendered prompt (the served
    model adds its chat template itself)."""
    import ast
    import re

    readme = (REPO / "README.md").read_text()
    loaded = re.search(r"pyfunc.load_model\('models:/temper-demo@champion'\).predict\(\[('[^']*')\]\)", readme).group(1)
    served = re.search(r'"inputs": \[("[^"]*")\]', readme).group(1)
    trained = catalog["arithmetic"].render_prompt({"question": "3 + 4"})
    assert ast.literal_eval(loaded) == trained and json.loads(served) == trained
