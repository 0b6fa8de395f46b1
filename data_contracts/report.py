"""What a contract check found, per domain: plain dataclasses, no Great Expectations import.

Kept apart from ``runner.py`` so that code which only passes reports around (the CLI's parent
process, Prefect tasks, flow reports) does not pay GX's ~3 s import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Failure:
    check: str
    column: str | None
    expectation: str
    unexpected_count: int | None
    unexpected_percent: float | None
    sample_values: list[Any]
    observed: Any = None


@dataclass
class DomainReport:
    domain: str
    contract: str
    dataset_uri: str
    digest: str
    rows: int
    success: bool
    expectations: int
    failures: list[Failure] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
