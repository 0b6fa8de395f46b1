import json

import pytest

from temper.errors import DatasetError
from temper.generators import GENERATORS, generate


# reasoning_gym generates one pack domain in a worker process: tests/integration/test_reasoning_gym_pack.py
@pytest.mark.parametrize("name", sorted(n for n in GENERATORS if n != "reasoning_gym"))
def test_generators_are_deterministic_and_complete(name):
    a = generate(name, 200, 3, 0.1, {})
    b = generate(name, 200, 3, 0.1, {})
    assert a.equals(b)
    assert not a.equals(generate(name, 200, 4, 0.1, {}))
    assert a["id"].is_unique
    assert {"id", "split", "reference"} <= set(a.columns)
    assert 0.03 < (a["split"] == "eval").mean() < 0.2


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
