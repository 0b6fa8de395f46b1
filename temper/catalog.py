"""The domain catalog: one YAML file per downstream domain, loaded into typed models.

A domain says where its dataset lives, how a record becomes a prompt, which verifier
scores a completion, how much the domain counts in the RL mix and which data contract
guards it. The catalog is a directory; every ``*.yaml`` under it is one domain.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from temper.config_files import load_config, parse_config, read_yaml
from temper.errors import CatalogError


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

    family: str = Field(description="Registered verifier family name (see temper.verifiers).")
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
    # Set by temper.packs for domains a pack expanded: the pack's name and digest, and the contract
    # built from the pack's template (temper.packs.contract_for). None for single-file domains.
    _pack: str | None = PrivateAttr(default=None)
    _pack_digest: str | None = PrivateAttr(default=None)
    _contract: Any = PrivateAttr(default=None)

    @field_validator("verifier")
    @classmethod
    def _known_family(cls, v: VerifierSpec) -> VerifierSpec:
        from temper.verifiers.registry import known_families

        families = known_families()
        if v.family not in families:
            raise ValueError(f"unknown verifier family {v.family!r}; known: {', '.join(sorted(families))}")
        return v

    @model_validator(mode="after")
    def _template_fields(self) -> "Domain":
        import string

        for _, field_name, _, _ in string.Formatter().parse(self.prompt_template):
            if field_name is not None and not field_name.isidentifier():
                raise ValueError(f"prompt_template field {{{field_name}}} is not a column name")
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


def load_domain(path: Path) -> Domain:
    """Parse one domain file; every failure names the file, the field and the reason."""
    return load_config(path, Domain, CatalogError, "domain")


def load_catalog(directory: Path | str) -> dict[str, Domain]:
    """Load every ``*.yaml`` under ``directory`` (recursively), keyed by domain name.

    A file with a top-level ``pack:`` key is a domain pack and adds every domain it expands to
    (``temper.packs``); a name defined twice, by files or packs, is an error naming both.
    """
    from temper.packs import expand_pack, is_pack_file

    directory = Path(directory)
    if not directory.is_dir():
        raise CatalogError(f"catalog directory {directory} does not exist")
    domains: dict[str, Domain] = {}
    for path in sorted(directory.rglob("*.yaml")):
        raw = read_yaml(path, CatalogError, "domain")
        if is_pack_file(raw):
            found = expand_pack(path, raw)
        else:
            found = [parse_config(raw, Domain, path, CatalogError, "domain")]
        for domain in found:
            if domain.name in domains:
                what = f"task {domain.dataset.generator_params.get('task')!r} expands to " if domain._pack else ""
                raise CatalogError(f"{path}: {what}domain name {domain.name!r} already defined in "
                                   f"{domains[domain.name].source_file}")
            domains[domain.name] = domain
    if not domains:
        raise CatalogError(f"catalog directory {directory} holds no *.yaml domain files")
    return domains


def refuse_eval_only(domains: list[Domain], what: str) -> None:
    """Training's guard: an eval-only domain in ``domains`` is an error naming it (never a silent skip)."""
    held_out = [d.name for d in domains if not d.trainable]
    if held_out:
        raise CatalogError(f"{what}: domain(s) {', '.join(held_out)} have role 'eval' (held-out benchmark data) "
                           "and cannot be trained on; drop them from the training domains or change their role")


def split_by_role(names: list[str], roles: dict[str, str]) -> tuple[list[str], list[str]]:
    """A run's domains -> (those it trains on, its default eval suite).

    Eval-only domains are never trained on but are evaluated; train-only ones are not evaluated
    by default. Raises when nothing is left to train on, naming the domains.
    """
    trainable = [n for n in names if roles.get(n, "both") != "eval"]
    if not trainable:
        raise CatalogError(f"no trainable domain among {', '.join(names)}: all have role 'eval' (held-out benchmarks)")
    return trainable, [n for n in names if roles.get(n, "both") != "train"]


def select_domains(catalog: dict[str, Domain], patterns: list[str] | None) -> list[Domain]:
    """Domains whose names match any of the glob patterns (all when none given), in name order."""
    if not patterns:
        return [catalog[n] for n in sorted(catalog)]
    chosen = sorted({n for n in catalog for p in patterns if fnmatch.fnmatchcase(n, p)})
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in catalog)]
    if unmatched:
        raise CatalogError(f"no domain matches {', '.join(unmatched)}; known: {', '.join(sorted(catalog))}")
    return [catalog[n] for n in chosen]
