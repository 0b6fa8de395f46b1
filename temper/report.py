"""Markdown reports of flow runs: one text for the Prefect artifact and the MLflow artifact."""

from __future__ import annotations

from data_contracts.runner import DomainReport


def validation_markdown(reports: list[DomainReport]) -> str:
    lines = ["| domain | contract | rows | digest | result |", "|---|---|---:|---|---|"]
    for r in reports:
        if r.error:
            result = f"error: {r.error}"
        elif r.success:
            result = "pass"
        else:
            result = "; ".join(f"{f.check} on {f.column}: {f.unexpected_count if f.unexpected_count is not None else f.observed}"
                               for f in r.failures)
            result = f"**FAIL** {result}"
        lines.append(f"| {r.domain} | {r.contract} | {r.rows} | `{r.digest[:12]}` | {result} |")
    return "\n".join(lines)


def before_after_markdown(before: dict[str, float], after: dict[str, float], champion: dict[str, float] | None) -> str:
    lines = ["| domain | base | candidate | delta | champion |", "|---|---:|---:|---:|---:|"]
    for d in sorted(after):
        b = before.get(d)
        c = (champion or {}).get(d)
        lines.append(f"| {d} | {_f(b)} | {_f(after[d])} | {_f(after[d] - b if b is not None else None, sign=True)} | {_f(c)} |")
    return "\n".join(lines)


def _f(x: float | None, sign: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.3f}" if sign else f"{x:.3f}"
