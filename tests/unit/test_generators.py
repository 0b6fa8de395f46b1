import json

import pytest

from temper.core.errors import DatasetError
from temper.data.generators import GENERATORS, generate


PUBLIC = {"humaneval", "bfcl", "nl2bash"}  # fixed data read from a package: no seed, no sampling
PACKED = {"reasoning_gym"}  # needs a task and tier from its pack: tests/integration/test_reasoning_gym_pack.py


@pytest.mark.parametrize("name", sorted(set(GENERATORS) - PUBLIC - PACKED))
def test_generators_are_deterministic_and_complete(name):
    a = generate(name, 200, 3, 0.1, {})
    b = generate(name, 200, 3, 0.1, {})
    assert a.equals(b)
    assert not a.equals(generate(name, 200, 4, 0.1, {}))
    assert a["id"].is_unique
    assert {"id", "split", "reference"} <= set(a.columns)
    assert 0.03 < (a["split"] == "eval").mean() < 0.2


@pytest.mark.parametrize("name,params,size", [("humaneval", {}, 164), ("bfcl", {"category": "simple_python"}, 400),
                                              ("bfcl", {"category": "parallel_multiple"}, 200), ("nl2bash", {}, 102)])
def test_public_benchmarks_are_read_whole_from_their_package(name, params, size):
    a = generate(name, size, 0, 1.0, params)
    assert a.equals(generate(name, size, 7, 1.0, params)) and len(a) == size and a["id"].is_unique
    assert set(a["split"]) == {"eval"}
    with pytest.raises(DatasetError, match=f"has {size} .*rows={size + 1}"):
        generate(name, size + 1, 0, 1.0, params)


def test_bfcl_unknown_category_names_it():
    with pytest.raises(DatasetError, match="category 'java' is not one of"):
        generate("bfcl", 10, 0, 1.0, {"category": "java"})


def test_tool_call_references_match_ground_truth():
    df = generate("tool_calls", 100, 0, 0.1, {})
    for ref, gt, fns in zip(df["reference"], df["ground_truth"], df["functions"]):
        offered = {f["name"] for f in json.loads(fns)}
        for call, truth in zip(json.loads(ref), json.loads(gt)):
            assert call["name"] in offered and set(truth) == {call["name"]}
            assert all(call["arguments"][k] in v for k, v in truth[call["name"]].items())


def test_python_references_pass_their_own_tests():
    df = generate("python_functions", 30, 0, 0.1, {})
    for r in df.to_dict(orient="records"):
        ns: dict = {}
        exec(r["prompt"] + r["reference"] + "\n" + r["test"], ns)
        ns["check"](ns[r["entry_point"]])


def test_bad_generator_params_name_the_generator():
    with pytest.raises(DatasetError, match="generator arithmetic: bad generator_params"):
        generate("arithmetic", 10, 0, 0.1, {"nope": 1})


def test_reasoning_gym_generator_needs_its_task():
    with pytest.raises(DatasetError, match="reasoning_gym generator needs generator_params.task"):
        generate("reasoning_gym", 10, 0, 0.1, {})
