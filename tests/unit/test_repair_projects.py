"""The repair family's data, without a sandbox: every bug template is a real bug, every generated project
is one the visible tests and the hidden cases both catch, tiers are what they say, the judge's comparison
is plain data, and only the package's regular .py files reach the judge."""

from __future__ import annotations

import io
import json
import random
import tarfile

import pytest

from temper.agent.repair import package_sources
from temper.agent.repair_harness import same
from temper.core.errors import DatasetError
from temper.data.generators import generate
from temper.data.repair_projects import BUG_KINDS, call, load_project, module_source, templates

MODULES = templates()


def _project(bugs=()):
    names = {"stats", "text", "seqs", "money", "report"}
    return load_project("pkg", {n: module_source(MODULES[n], "pkg", tuple(b for b in bugs if b in MODULES[n].bugs))
                                for n in names})


@pytest.mark.parametrize("bug", [b for t in MODULES.values() for b in t.bugs],
                         ids=lambda b: f"{b.function}-{b.kind}")
def test_every_bug_template_applies_once_and_changes_what_its_function_returns(bug):
    template = next(t for t in MODULES.values() if bug in t.bugs)
    assert template.source.count(bug.old) == 1
    good, bad = _project(), _project([bug])
    rng = random.Random(0)
    inputs = template.functions[bug.function].edge_args + [template.functions[bug.function].args(rng)
                                                            for _ in range(20)]
    changed = [a for a in inputs if call(good, template.name, bug.function, a) != call(bad, template.name,
                                                                                        bug.function, a)]
    assert changed, "the edit changes nothing its function is called with"
    assert all(call(good, template.name, bug.function, a)[0] for a in inputs)  # the correct source never raises


def test_every_bug_kind_the_issue_names_is_present():
    assert {b.kind for t in MODULES.values() for b in t.bugs} == set(BUG_KINDS)


@pytest.mark.parametrize("tier", [{"modules": 2, "bugs": 1}, {"modules": 3, "bugs": 2},
                                  {"modules": 4, "bugs": 2, "cross_module": True}])
def test_generated_projects_are_their_tier_and_reproducible(tier):
    df = generate("repair_tasks", 20, 3, 0.1, tier)
    assert df.equals(generate("repair_tasks", 20, 3, 0.1, tier))  # same seed, same projects
    assert df["id"].is_unique and set(df["split"]) <= {"train", "eval"}
    for rec in df.to_dict("records"):
        bugs = json.loads(rec["bugs"])
        files = json.loads(rec["start_files"])
        assert rec["modules"] == tier["modules"] and len(bugs) == tier["bugs"] == rec["bug_count"]
        assert len({b["function"] for b in bugs}) == len(bugs)  # one bug per function
        package_modules = [p for p in files if p.startswith(rec["package"] + "/") and not p.endswith("__init__.py")]
        assert len(package_modules) == tier["modules"]
        if tier.get("cross_module"):
            assert any(b["kind"] == "wrong_import" for b in bugs)
        cases = json.loads(rec["hidden_tests"])
        shown = "".join(t for p, t in files.items() if p.startswith("tests/"))
        drawn_apart = [c for c in cases if f"{c['function']}({', '.join(map(repr, c['args']))})" not in shown]
        assert len(drawn_apart) >= len(cases) // 3  # most hidden inputs are not the visible tests' inputs
        turns = json.loads(rec["reference"])
        assert turns[0] == "<bash>python3 run_tests.py</bash>" and turns[-1] == "<done/>"


def test_a_tier_that_cannot_exist_is_refused_naming_its_params():
    with pytest.raises(DatasetError, match=r"bugs \(3\) <= modules \(2\)"):
        generate("repair_tasks", 5, 0, 0.1, {"modules": 2, "bugs": 3})
    with pytest.raises(DatasetError, match="cross_module needs modules >= 3"):
        generate("repair_tasks", 5, 0, 0.1, {"modules": 2, "bugs": 1, "cross_module": True})


def test_the_judge_compares_plain_data():
    assert same(4, 4.0) and same(0.1 + 0.2, 0.3) and same({"a": [1, None]}, {"a": [1.0, None]})
    assert not same(True, 1) and not same(1, True) and not same(None, 0) and not same("1", 1)
    assert not same([1, 2], [2, 1]) and not same({"a": 1}, {"a": 1, "b": 2}) and not same([1], [1, 1])


def _tar(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, kind in entries:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_only_the_packages_regular_python_files_reach_the_judge():
    archive = _tar([("./pkg/__init__.py", b"", "file"), ("./pkg/stats.py", b"x = 1\n", "file"),
                    ("./pkg/__pycache__/stats.cpython-311.pyc", b"\x00\xff", "file"),
                    ("./pkg/link.py", b"", "link"), ("./tests/test_stats.py", b"assert True\n", "file"),
                    ("./conftest.py", b"import sys\n", "file"), ("./pkg/bin.py", b"\xff\xfe", "file"),
                    ("./pkgx/evil.py", b"", "file"), ("./pkg/../evil.py", b"", "file")])
    assert package_sources(archive, "pkg") == {"pkg/__init__.py": "", "pkg/stats.py": "x = 1\n"}


@pytest.mark.parametrize("tier", [{"modules": 2, "bugs": 1}, {"modules": 3, "bugs": 2},
                                  {"modules": 4, "bugs": 2, "cross_module": True}])
def test_answering_the_visible_calls_from_a_table_and_running_the_buggy_code_otherwise_fails(tier):
    """A red-team review's move, as a property of every record: a program that returns the visible tests'
    answers for their calls and runs the buggy package for every other call must fail a hidden case (before
    the fix, 5 of 40 repair_single records passed it: their bug showed only on the visible edge inputs)."""
    for rec in generate("repair_tasks", 40, 0, 0.1, tier).to_dict("records"):
        files, package = json.loads(rec["start_files"]), rec["package"]
        shown = {line.split(" == ", 1)[0].removeprefix("    assert ") for path, text in files.items()
                 if path.startswith("tests/") for line in text.splitlines() if line.startswith("    assert ")}
        buggy = load_project(package, {path[len(package) + 1:-3]: text for path, text in files.items()
                                       if path.startswith(package + "/") and not path.endswith("__init__.py")})

        def lookup_or_buggy_passes(case) -> bool:
            if f"{case['function']}({', '.join(map(repr, case['args']))})" in shown:
                return True  # answered from the table: the visible answer is the right one
            ok, value = call(buggy, case["module"], case["function"], tuple(case["args"]))
            return ok and same(json.loads(json.dumps(value)), case["expect"])

        assert not all(lookup_or_buggy_passes(c) for c in json.loads(rec["hidden_tests"])), rec["id"]
