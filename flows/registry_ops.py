"""promote_model / rollback_model: the registry levers as Prefect flows, deployable and run from the UI.

Thin on purpose: all logic is in ``temper.registry.aliases`` (shared with ``temper models``).
The flow adds what Prefect is for: a typed run form (the pydantic params), a run record,
and a markdown artifact with the audit event. A refused operation (gate says no, nothing
to roll back to) fails the flow run with the same one-line message the CLI prints.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from infra.tracking.connection import configure
from temper.registry.aliases import AliasChange, PromoteParams, RollbackParams, promote, rollback


def _report(change: AliasChange) -> dict:
    e = change.event
    lines = [f"**{change.summary()}**"]
    if e is not None:
        lines += ["", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in (("previous", e.previous), ("time", e.time), ("by", e.by),
                                               ("reason", e.reason), ("forced", e.forced), ("gate", e.gate))]
    create_markdown_artifact(markdown="\n".join(lines), key="registry-audit",
                             description=f"{change.model}@{change.alias}")
    get_run_logger().info(change.summary())
    return change.to_dict()


@flow(name="promote_model", log_prints=True)
def promote_model(params: PromoteParams) -> dict:
    configure()
    return _report(promote(params.model_name, params.version, reason=params.reason, alias=params.alias,
                           force=params.force, policy=params.policy))


@flow(name="rollback_model", log_prints=True)
def rollback_model(params: RollbackParams) -> dict:
    configure()
    return _report(rollback(params.model_name, alias=params.alias, reason=params.reason))
