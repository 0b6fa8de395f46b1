"""The domain catalog: one YAML file per downstream domain, loaded into typed models.

A domain says where its dataset lives, how a record becomes a prompt, which verifier
scores a completion, how much the domain counts in the RL mix and which data contract
guards it. The catalog is a directory; every ``*.yaml`` under it is one domain.
"""

from __future__ import annotations

import difflib
import fnmatch
from pathlib import Path

from temper.core.config_files import load_config, parse_config, read_yaml
from temper.core.errors import CatalogError
from temper.data.domain import Domain
from temper.data.packs import expand_pack, is_pack_file


def load_domain(path: Path) -> Domain:
    """Parse one domain file; every failure names the file, the field and the reason."""
    return load_config(path, Domain, CatalogError, "domain")


class Catalog(dict[str, Domain]):
    """The usable domains by name; ``unavailable``: the domains of packs whose source package is not installed
    (name -> why), so that asking for one says which package it needs while every other domain still works."""

    def __init__(self, domains: dict[str, Domain], unavailable: dict[str, str]) -> None:
        super().__init__(domains)
        self.unavailable = unavailable


def load_catalog(directory: Path | str) -> Catalog:
    """Load every ``*.yaml`` under ``directory`` (recursively), keyed by domain name.

    A file with a top-level ``pack:`` key is a domain pack and adds every domain it expands to
    (``temper.data.packs``); a name defined twice, by files or packs, is an error naming both.
    A pack whose source package is missing adds its domains to ``Catalog.unavailable`` instead.
    """

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
    unavailable = {n: d._unavailable for n, d in domains.items() if d._unavailable}
    return Catalog({n: d for n, d in domains.items() if n not in unavailable}, unavailable)


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
    missing = sorted({n for n in getattr(catalog, "unavailable", {}) for p in patterns if fnmatch.fnmatchcase(n, p)})
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CatalogError(f"domain {missing[0]}{more}: {catalog.unavailable[missing[0]]}")
    chosen = sorted({n for n in catalog for p in patterns if fnmatch.fnmatchcase(n, p)})
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in catalog)]
    if unmatched:
        raise CatalogError(f"no domain matches {'; '.join(closest(p, catalog) for p in unmatched)} "
                           f"(`temper domains list` shows all {len(catalog)})")
    return [catalog[n] for n in chosen]


def closest(pattern: str, names, n: int = 5) -> str:
    """``pattern`` and the few names nearest to it: with hundreds of pack domains, the full list buries the typo."""
    near = difflib.get_close_matches(pattern, sorted(names), n=n, cutoff=0.6)
    return f"{pattern} (closest: {', '.join(near)})" if near else f"{pattern} (no close name)"
