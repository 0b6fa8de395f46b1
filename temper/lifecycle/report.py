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


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """A clickable MLflow UI link when tracking is a server; else the run id and the UI command."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"[{run_id[:8]}]({tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id})"
    return f"`{run_id}` (`mlflow ui --backend-store-uri {tracking_uri}`)"


def post_training_markdown(*, flow_run: str, domains: list[str], validation: str, before: dict[str, float],
                           after: dict[str, float], champion: dict[str, float] | None, champion_version: str | None,
                           decision: str, registered: dict | None, lifecycle_link: str,
                           stopped: str | None = None, failed: str | None = None) -> str:
    """The post-training report: the same text goes to Prefect and to MLflow.

    ``stopped``: a data contract stopped the run before training; ``failed``: a stage failed
    after the lifecycle run opened (what failed and why).
    """
    if failed:
        return "\n".join([f"# post_training {flow_run}: FAILED", "", f"Lifecycle run: {lifecycle_link}", "",
                          "## Failed", "", failed, "", "The lifecycle run is closed as FAILED; no alias moved unless "
                          "the failure came after registration (see the registry's audit trail)."])
    lines = [f"# post_training {flow_run}", "", f"Domains: {', '.join(domains)}", f"Lifecycle run: {lifecycle_link}", "",
             "## Data contracts", "", validation, ""]
    if stopped:
        lines += ["## Stopped before training", "", stopped, "", "No training ran and no model version was registered."]
        return "\n".join(lines)
    lines += ["## Mean reward per domain (greedy, eval split)", "", before_after_markdown(before, after, champion), "",
              f"Champion before this run: {f'version {champion_version}' if champion_version else 'none'}", "",
              "## Gate", "", decision, ""]
    if registered:
        lines += ["## Registered", "", f"`{registered['name']}` version **{registered['version']}**, alias "
                  f"**{registered['alias']}**", ""]
    return "\n".join(lines)
