"""Family name -> verifier class, built once from the one list of families.

The list is ``temper.verifiers.families.FAMILIES``; the names alone are the leaf
``temper.data.verifier_families``, which is what a ``Domain`` checks its family against, so
loading a catalog imports no family, judge or sandbox. Here the classes are needed: the first
lookup imports them.
"""

from __future__ import annotations

from typing import Any

from temper.verifiers.base import Verifier

_classes: dict[str, type[Verifier]] | None = None


def _registry() -> dict[str, type[Verifier]]:
    global _classes
    if _classes is None:
        # lazy: the families import judges, the sandbox and reasoning_gym (530 ms); `temper verify`
        # imports this module, and every `temper` start-up loads every command module (--help)
        from temper.verifiers.families import FAMILIES

        classes: dict[str, type[Verifier]] = {}
        for cls in FAMILIES:
            if cls.family in classes:
                raise ValueError(f"verifier family {cls.family!r} listed twice")
            classes[cls.family] = cls
        _classes = classes  # whole or not at all: a thread looking up meanwhile never sees half of it
    return _classes


def sandbox_profile_of(family: str) -> str:
    """The sandbox profile a family's verifier runs programs in ('none': it scores in process)."""
    cls = _registry().get(family)
    return cls.sandbox_profile if cls is not None else "none"


def get_verifier(family: str, params: dict[str, Any] | None = None) -> Verifier:
    registry = _registry()
    try:
        cls = registry[family]
    except KeyError:
        raise KeyError(f"unknown verifier family {family!r}; known: {', '.join(sorted(registry))}") from None
    return cls(**(params or {}))
