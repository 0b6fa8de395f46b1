"""The typed form of a contract YAML file."""

from __future__ import annotations

import difflib

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from data_contracts.rules import RULES
from temper.core.config_files import load_config
from temper.core.errors import ContractError

ColumnType = Literal["str", "int", "float", "bool"]


class ColumnRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: ColumnType | None = Field(default=None, description="Python type every value must have.")
    not_null: bool = Field(default=True, description="No missing values.")
    unique: bool = Field(default=False, description="No two rows share a value (ids).")
    min_length: int | None = Field(default=None, ge=0, description="Shortest allowed string.")
    max_length: int | None = Field(default=None, ge=1, description="Longest allowed string.")
    allowed: list[str | int | float | bool] | None = Field(default=None, description="The only values allowed.")
    regex: str | None = Field(default=None, description="Every value must match this regex (re.search).")


class SplitRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    column: str = Field(default="split", description="Column that names each row's split.")
    eval_value: str = Field(default="eval", description="Value that marks a held-out row.")
    eval_fraction_min: float = Field(ge=0, le=1, description="Smallest acceptable share of eval rows.")
    eval_fraction_max: float = Field(ge=0, le=1, description="Largest acceptable share of eval rows.")


class FamilyRule(BaseModel):
    """A check that needs code, not a column property: see data_contracts/rules.py."""

    model_config = ConfigDict(extra="forbid")

    rule: str = Field(description="Rule name registered in data_contracts/rules.py.")
    column: str = Field(description="Column the rule reads (reported as the failing column).")
    with_column: str | None = Field(default=None, description="Second column some rules compare against.")


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    description: str = ""
    min_rows: int = Field(default=1, ge=0, description="Fewest rows a dataset may have.")
    max_rows: int | None = Field(default=None, ge=1, description="Most rows a dataset may have.")
    columns: dict[str, ColumnRule] = Field(description="Required columns and their rules.")
    split: SplitRule | None = None
    rules: list[FamilyRule] = Field(default_factory=list)
    source_file: str | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _rules_known(self) -> "Contract":
        for i, r in enumerate(self.rules):
            if r.rule not in RULES:
                raise ValueError(f"unknown rule {r.rule!r}; known: {', '.join(sorted(RULES))}")
            # a rule over a column the contract does not require fails every row, which reads as bad data
            for key in ("column", "with_column"):
                value = getattr(r, key)
                if value is not None and value not in self.columns:
                    close = difflib.get_close_matches(value, list(self.columns), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"rules[{i}].{key}: {value!r} is not a column of the contract{hint}; "
                                     f"columns: {', '.join(self.columns)}")
        return self


def load_contract(path: Path) -> Contract:
    return load_config(path, Contract, ContractError, "contract")


def load_contracts(directory: Path) -> dict[str, Contract]:
    contracts = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        c = load_contract(path)
        if c.name in contracts:
            raise ContractError(f"{path}: contract {c.name!r} already defined in {contracts[c.name].source_file}")
        contracts[c.name] = c
    return contracts
