"""A per-domain rubric: what the judge is asked to weigh, on which scale, with worked examples.

People edit rubrics as YAML (``rubrics/<domain>.yaml``). The rubric's digest is part of the
judge cache key, so editing a rubric re-scores everything it touched and nothing else.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from temper.errors import TemperError, describe_validation_error


class RubricError(TemperError):
    """A rubric file is missing, malformed or inconsistent."""


class Example(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str
    response: str
    score: int
    why: str = ""


class Rubric(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Usually the domain name.")
    task: str = Field(description="One sentence: what a good response does.")
    criteria: list[str] = Field(min_length=1, description="What the judge weighs, most important first.")
    scale_min: int = Field(default=1, description="Lowest score.")
    scale_max: int = Field(default=5, description="Highest score.")
    examples: list[Example] = Field(default_factory=list, description="Scored examples shown to the judge.")
    agreement_threshold: float = Field(default=0.5, ge=-1, le=1,
                                       description="Minimum judge-human Spearman for the domain to count as verified.")

    @model_validator(mode="after")
    def _check(self) -> "Rubric":
        if self.scale_max <= self.scale_min:
            raise ValueError(f"scale_max ({self.scale_max}) must exceed scale_min ({self.scale_min})")
        bad = [e.score for e in self.examples if not self.scale_min <= e.score <= self.scale_max]
        if bad:
            raise ValueError(f"example scores {bad} outside the scale {self.scale_min}..{self.scale_max}")
        return self

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()

    def normalise(self, score: int | float) -> float:
        """A scale score -> reward in [0, 1]."""
        return (float(score) - self.scale_min) / (self.scale_max - self.scale_min)

    def judge_prompt(self, prompt: str, response: str) -> str:
        lines = [f"You grade responses. Task: {self.task}", "Criteria:"]
        lines += [f"- {c}" for c in self.criteria]
        lines.append(f"Answer with 'Score: N' where N is an integer from {self.scale_min} to {self.scale_max}, "
                     "then one line of rationale.")
        for e in self.examples:
            lines += ["", f"Prompt: {e.prompt}", f"Response: {e.response}", f"Score: {e.score}" + (f" ({e.why})" if e.why else "")]
        lines += ["", f"Prompt: {prompt}", f"Response: {response}", "Score:"]
        return "\n".join(lines)


def load_rubric(path: str | Path) -> Rubric:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise RubricError(f"{path}: cannot read rubric: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise RubricError(f"{path}: malformed YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, dict):
        raise RubricError(f"{path}: expected a mapping of rubric fields, got {type(raw).__name__}")
    try:
        return Rubric.model_validate(raw)
    except ValidationError as e:
        raise RubricError(describe_validation_error(path, e)) from None
