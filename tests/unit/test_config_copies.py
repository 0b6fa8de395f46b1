"""The YAML files people edit that hold training settings, against the one model of those settings.

The rule, stated in the first line of each file: every key is a field of its model (a misspelt key
fails here, whatever its value), and a value commented ``# default`` only repeats the model's default,
so it must still equal it; any other value is the file's own choice (an override, or a value pinned on
purpose). A default changed in the model then fails here until each marked copy follows it.
"""

from __future__ import annotations

import importlib
import re
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from temper.core.errors import TemperError
from temper.lifecycle.params import PostTrainingParams, load_params
from temper.training.config import TrainConfig, load_config
from tests.conftest import REPO

RULE = ('a value commented "# default" only repeats its default '
        '(both checked: tests/unit/test_config_copies.py).')
MARK = re.compile(r"#\s*default\b")
MODELS = {"TrainConfig": TrainConfig, "PostTrainingParams": PostTrainingParams}
LOADERS = {TrainConfig: load_config, PostTrainingParams: load_params}
FILES = sorted([*(REPO / "configs" / "train").glob("*.yaml"), *(REPO / "configs" / "params").glob("*.yaml")])


def nested_model(annotation) -> type[BaseModel] | None:
    """The model a field holds (``SFTSettings | None`` -> SFTSettings), if any."""
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def check(node: yaml.Node, model: type[BaseModel], lines: list[str], where: str) -> list[str]:
    """Problems of a mapping node read as ``model``: unknown keys, and marked copies that differ from the default."""
    if not isinstance(node, yaml.MappingNode):
        return []
    problems = []
    for key, value in node.value:
        name, at = key.value, f"{where}:{key.start_mark.line + 1} {key.value}"
        field = model.model_fields.get(name)
        if field is None:
            problems.append(f"{at}: not a field of {model.__name__}")
            continue
        if MARK.search(lines[key.start_mark.line].partition(f"{name}:")[2]):
            default = field.get_default(call_default_factory=True)
            default = default.model_dump(mode="json") if isinstance(default, BaseModel) else default
            if (raw := yaml.safe_load(yaml.serialize(value))) != default:
                problems.append(f"{at}: marked '# default' but is {raw!r}; {model.__name__}'s default is {default!r}")
        if sub := nested_model(field.annotation):
            problems += check(value, sub, lines, where)
    return problems


def rule_model(path: Path) -> type[BaseModel]:
    first = path.read_text().splitlines()[0]
    match = re.fullmatch(r"# Keys are fields of (\w+); (.*)", first)
    assert match and match[2] == RULE, f"{path}: the first line must state the rule: # Keys are fields of <Model>; {RULE}"
    return MODELS[match[1]]


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_key_is_a_field_and_every_marked_copy_equals_the_default(path):
    model = rule_model(path)
    LOADERS[model](path)  # the project's loader: the file is valid as its model
    text = path.read_text()
    assert check(yaml.compose(text), model, text.splitlines(), path.name) == []


def test_deployment_parameters_follow_the_same_rule():
    """prefect.yaml: each deployment's parameters are its flow's parameters, each model read as above."""
    path = REPO / "prefect.yaml"
    text = path.read_text()
    assert text.splitlines()[0] == f"# Keys under parameters: are fields of the flows' parameter models; {RULE}"
    doc, lines, problems = yaml.compose(text), text.splitlines(), []
    for deployment in {k.value: v for k, v in doc.value}["deployments"].value:
        fields = {k.value: v for k, v in deployment.value}
        if "parameters" not in fields:
            continue
        file, _, name = fields["entrypoint"].value.partition(":")
        flow = getattr(importlib.import_module(file.removesuffix(".py").replace("/", ".")), name)
        hints = typing.get_type_hints(flow.fn)
        for key, value in fields["parameters"].value:
            assert key.value in hints, f"prefect.yaml:{key.start_mark.line + 1}: {key.value} is no parameter of {name}"
            if model := nested_model(hints[key.value]):
                problems += check(value, model, lines, "prefect.yaml")
                model.model_validate(yaml.safe_load(yaml.serialize(value)))
    assert problems == []


def test_the_check_finds_a_misspelt_key_and_a_stale_copy_and_accepts_an_override(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text(f"# Keys are fields of TrainConfig; {RULE}\nmode: grpo\nrun_name: r\nbase_model: /m\n"
                    "output_dir: /o\nseed: 3\ngrpo:\n  temperature: 0.5   # default: not so\n"
                    "  max_steps: 7          # an override\n  curriculum: {windw: 2}\n")
    text = path.read_text()
    assert rule_model(path) is TrainConfig
    assert check(yaml.compose(text), TrainConfig, text.splitlines(), "grpo.yaml") == [
        "grpo.yaml:8 temperature: marked '# default' but is 0.5; GRPOSettings's default is 0.8",
        "grpo.yaml:10 windw: not a field of CurriculumSettings"]
    with pytest.raises(TemperError, match=r"field 'grpo.curriculum.windw': Extra inputs"):
        load_config(path)  # the loader agrees on the key
