"""A judge domain's ``verifier.params``, typed, and the rubric they name.

Read by the ``judge`` verifier family (``temper.verifiers.families.judge``), which scores with
them, and by calibration (``temper.judges.calibration``) and human validation, which only need
the rubric, the judge's identity and the calibration overrides: here, in the judges room, so
those readers need no verifier (the verifier room sits above this one).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from temper.core.errors import describe_validation_error
from temper.core.templates import template_columns
from temper.judges import RubricError
from temper.judges.judge import JudgeSpec
from temper.judges.rubric import CalibrationOverrides, Rubric, resolve_rubric


class JudgeVerifierParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rubric: str | dict[str, Any] = Field(description="Rubric name (rubrics/<name>.yaml), path, or inline mapping.")
    judge: JudgeSpec
    prompt_template: str = Field(default="{prompt}",
                                 description="The task as the judge sees it (str.format over the record).")
    reference_field: str | None = Field(default=None, description="Record column shown to the judge as a reference.")
    calibration: CalibrationOverrides = Field(default_factory=CalibrationOverrides)

    @field_validator("prompt_template")
    @classmethod
    def _plain_columns(cls, v: str) -> str:
        template_columns(v)  # no attribute or index lookups: a judge prompt must not reach interpreter internals
        return v


def parse_params(params: dict[str, Any]) -> tuple[JudgeVerifierParams, Rubric]:
    """Typed params and the resolved rubric; a bad rubric or judge spec raises naming the field."""
    try:
        p = JudgeVerifierParams.model_validate(params)
    except ValidationError as e:
        raise RubricError(describe_validation_error("judge verifier params", e)) from None
    return p, resolve_rubric(p.rubric)
