"""The typed form of a rubric YAML: criteria, an integer scale, worked examples, calibration overrides.

A rubric's digest (sha256 of its canonical JSON) is part of every judge cache key and of
every calibration run, so editing a rubric invalidates cached scores and stale calibrations
instead of silently reusing them.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from temper.core.config_files import load_config, parse_config
from temper.judges import RubricError

#: Where bare rubric names ('summaries') resolve: the shipped rubrics/ directory.
RUBRICS_DIR = Path(__file__).resolve().parents[2] / "rubrics"


class Criterion(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Short name of what is judged, e.g. 'faithfulness'.")
    description: str = Field(min_length=1, description="What a high score means on this criterion.")


class Scale(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min: int = Field(default=1, description="Lowest score a judge or reviewer may give.")
    max: int = Field(default=5, description="Highest score.")
    labels: dict[int, str] = Field(default_factory=dict, description="Meaning of (some) scale points.")

    @model_validator(mode="after")
    def _ordered(self) -> "Scale":
        if self.max <= self.min:
            raise ValueError(f"scale max ({self.max}) must be greater than min ({self.min})")
        outside = sorted(k for k in self.labels if not self.min <= k <= self.max)
        if outside:
            raise ValueError(f"scale labels {outside} lie outside [{self.min}, {self.max}]")
        return self

    @property
    def points(self) -> list[int]:
        return list(range(self.min, self.max + 1))

    def normalize(self, raw: float) -> float:
        """A raw score on the scale -> [0, 1] (the verifier reward)."""
        return (raw - self.min) / (self.max - self.min)

    def to_point(self, normalized: float) -> int:
        """A [0, 1] score -> the nearest scale point (half up): the bin kappa compares."""
        return int(math.floor(self.min + normalized * (self.max - self.min) + 0.5))


class Example(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str
    response: str
    score: int
    rationale: str = ""


class CalibrationOverrides(BaseModel):
    """Per-domain overrides of the calibration policy; unset fields keep the policy default."""

    model_config = ConfigDict(extra="forbid")

    min_spearman: float | None = Field(default=None, ge=-1, le=1)
    min_kappa: float | None = Field(default=None, ge=-1, le=1)
    min_n: int | None = Field(default=None, ge=2)
    mode: Literal["exclude", "downweight"] | None = None
    factor: float | None = Field(default=None, gt=0, le=1)


class Rubric(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    description: str = ""
    criteria: list[Criterion] = Field(min_length=1)
    scale: Scale = Field(default_factory=Scale)
    examples: list[Example] = Field(default_factory=list)
    calibration: CalibrationOverrides = Field(default_factory=CalibrationOverrides)
    source_file: str | None = Field(default=None, exclude=True)

    @field_validator("examples")
    @classmethod
    def _examples_on_scale(cls, examples: list[Example], info: ValidationInfo) -> list[Example]:
        scale = info.data.get("scale")
        for i, ex in enumerate(examples if scale else []):
            if not scale.min <= ex.score <= scale.max:
                raise ValueError(f"examples[{i}].score {ex.score} lies outside [{scale.min}, {scale.max}]")
        return examples

    @property
    def digest(self) -> str:
        """What the judge sees (calibration overrides excluded: changing a threshold is not a new rubric)."""
        blob = json.dumps(self.model_dump(mode="json", exclude={"calibration"}), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def parse_rubric(raw: Any, source: str) -> Rubric:
    return parse_config(raw, Rubric, source, RubricError, "rubric")


def load_rubric(path: Path) -> Rubric:
    return load_config(path, Rubric, RubricError, "rubric")


def resolve_rubric(ref: str | dict[str, Any], rubrics_dir: Path | None = None) -> Rubric:
    """A rubric from a domain's verifier params: an inline mapping, a path, or a bare name.

    Bare names ('summaries') resolve to ``<rubrics_dir>/<name>.yaml`` (default: the shipped
    rubrics/); relative paths resolve against the working directory, then the repository.
    """
    if isinstance(ref, dict):
        return parse_rubric(ref, f"inline rubric {ref.get('name', '?')!r}")
    if not isinstance(ref, str) or not ref:
        raise RubricError(f"rubric must be a name, a path or a mapping, got {ref!r}")
    if "/" not in ref and not ref.endswith((".yaml", ".yml")):
        return load_rubric((rubrics_dir or RUBRICS_DIR) / f"{ref}.yaml")
    path = Path(ref)
    if not path.is_absolute() and not path.exists():
        path = RUBRICS_DIR.parent / ref
    return load_rubric(path)
