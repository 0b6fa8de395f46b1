"""Name -> verifier class. Families register themselves with ``@register``.

``known_families`` must stay cheap: the catalog calls it for every domain file it loads.
"""

from __future__ import annotations

import importlib
from typing import Any

from temper.verifiers.base import Verifier

_REGISTRY: dict[str, type[Verifier]] = {}

# Modules that define families; imported once, on first lookup.
_FAMILY_MODULES = ("temper.verifiers.families",)
_loaded = False


def register(cls: type[Verifier]) -> type[Verifier]:
    if cls.family in _REGISTRY and _REGISTRY[cls.family] is not cls:
        raise ValueError(f"verifier family {cls.family!r} registered twice")
    _REGISTRY[cls.family] = cls
    return cls


def _load() -> None:
    global _loaded
    if not _loaded:
        for mod in _FAMILY_MODULES:
            importlib.import_module(mod)
        _loaded = True


def known_families() -> set[str]:
    _load()
    return set(_REGISTRY)


def sandbox_profile_of(family: str) -> str:
    """The sandbox profile a family's verifier runs programs in ('none': it scores in process)."""
    _load()
    cls = _REGISTRY.get(family)
    return cls.sandbox_profile if cls is not None else "none"


def get_verifier(family: str, params: dict[str, Any] | None = None) -> Verifier:
    _load()
    try:
        cls = _REGISTRY[family]
    except KeyError:
        raise KeyError(f"unknown verifier family {family!r}; known: {', '.join(sorted(_REGISTRY))}") from None
    return cls(**(params or {}))
