"""The typed form of one domain: where its data lives, how a record becomes a prompt, which verifier
scores a completion, how much it counts in the mix, which contract guards it.

Kept apart from the catalog (which finds, expands and selects domains) so that domain packs,
which build Domains, and the catalog, which loads packs, do not import each other.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from temper.core.errors import CatalogError
from temper.core.templates import template_columns
from temper.data.verifier_families import VERIFIER_FAMILIES


class DatasetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uri: str = Field(
        description="fsspec URI of the dataset file. '{store}' expands to the configured storage root."
    )
    format: Literal["jsonl", "parquet"] = Field(description="File format of the dataset.")
    generator: str | None = Field(
        default=None,
        description="Name of the built-in generator that writes this dataset (`temper data generate`). "
        "None for datasets that are brought from elsewhere.",
    )
    rows: int = Field(default=1000, gt=0, description="Rows the generator writes.")
    seed: int = Field(default=0, description="Seed of the generator: same seed, same bytes.")
    generator_params: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments of the generator (e.g. max_operand)."
    )


class VerifierSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    family: str = Field(description="Verifier family name (temper.data.verifier_families; the classes: temper.verifiers.families).")
    params: dict[str, Any] = Field(default_factory=dict, description="Family-specific parameters.")


class SplitSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    column: str = Field(default="split", description="Column holding each record's split name.")
    train: str = Field(default="train", description="Value of the column for training records.")
    eval: str = Field(default="eval", description="Value of the column for held-out eval records.")
    eval_fraction: float = Field(
        default=0.1, gt=0, le=1,
        description="Expected share of eval records (the contract checks it); 1 for an eval-only benchmark.",
    )


class Domain(BaseModel):
    """One downstream domain of verifiable-reward post-training."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="Unique, lowercase identifier.")
    description: str = Field(description="What the model must learn here, for people.")
    dataset: DatasetSpec
    prompt_template: str = Field(
        description="Python str.format template over the record's columns, e.g. '{question}\\nAnswer:'."
    )
    verifier: VerifierSpec
    reward_weight: float = Field(default=1.0, ge=0, description="Multiplier applied to this domain's rewards.")
    sampling_ratio: float = Field(
        default=1.0, gt=0, description="Relative share of this domain in an RL batch (normalised over the mix)."
    )
    contract: str = Field(description="Name of the data contract in data_contracts/ that guards the dataset.")
    sandbox_profile: Literal["none", "python", "shell"] = Field(
        default="none", description="Sandbox profile the verifier needs; 'none' means it runs in process."
    )
    split: SplitSpec = Field(default_factory=SplitSpec)
    role: Literal["train", "eval", "both"] = Field(
        default="both",
        description="What a run may use this domain for. 'eval': held-out benchmark, never trained on "
        "(public benchmarks default to it, so a run cannot train on a test set by accident); "
        "'train': trained on, not in the default eval suite; 'both': either.",
    )
    source_file: str | None = Field(default=None, exclude=True, description="YAML file it came from.")
    # Set by temper.data.packs for domains a pack expanded: the pack's name and digest, and the contract
    # built from the pack's template (temper.data.packs.contract_for). None for single-file domains.
    _pack: str | None = PrivateAttr(default=None)
    _unavailable: str | None = PrivateAttr(default=None)  # why it cannot be generated or scored here (a pack's package)
    _pack_digest: str | None = PrivateAttr(default=None)
    _contract: Any = PrivateAttr(default=None)

    @field_validator("verifier")
    @classmethod
    def _known_family(cls, v: VerifierSpec) -> VerifierSpec:
        if v.family not in VERIFIER_FAMILIES:
            raise ValueError(f"unknown verifier family {v.family!r}; known: {', '.join(sorted(VERIFIER_FAMILIES))}")
        return v

    @model_validator(mode="after")
    def _template_fields(self) -> "Domain":
        try:
            template_columns(self.prompt_template)
        except ValueError as e:
            raise ValueError(f"prompt_template: {e}") from None
        return self

    @property
    def trainable(self) -> bool:
        return self.role != "eval"

    def dataset_uri(self, storage_root: str) -> str:
        return self.dataset.uri.replace("{store}", storage_root.rstrip("/"))

    def render_prompt(self, record: dict[str, Any]) -> str:
        try:
            return self.prompt_template.format(**record)
        except KeyError as e:
            raise CatalogError(f"domain {self.name}: prompt_template needs column {e.args[0]!r}, record has {sorted(record)}") from None
