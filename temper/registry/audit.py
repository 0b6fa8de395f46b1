"""The audit trail of an alias: who moved it, from which version to which, when and why.

Every alias move (``promote``, ``rollback``, the post_training flow's gate) appends one event
to the registered model's tags, ``temper.audit.<alias>.<seq>`` = JSON (action, version,
previous holder, time, reason, who, gate). Registered-model tags because aliases are
model-level; the version that receives the alias also gets ``temper.audit.<alias>`` = the same
event, so its page in the MLflow UI says why it holds the alias. Rollback replays the trail as
a stack of holders, so successive rollbacks walk further back (v3 -> v2 -> v1) instead of
toggling between the last two. Sequence numbers are allocated under ``lock.model_lock``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

from temper.core.tag_names import VERSION_AUDIT_TAG


@dataclass(frozen=True)
class AuditEvent:
    seq: int
    action: Literal["promote", "rollback"]
    alias: str
    version: str
    previous: str | None
    time: str
    reason: str
    by: str
    forced: bool = False
    gate: str | None = None

    def __post_init__(self) -> None:  # events written before versions were normalised hold ints
        object.__setattr__(self, "version", str(self.version))
        if self.previous is not None:
            object.__setattr__(self, "previous", str(self.previous))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def audit_events(model_tags: dict[str, str], alias: str) -> list[AuditEvent]:
    """The audit trail of one alias, in order. Unreadable entries are skipped, not fatal:
    a hand-edited tag must not lock the operator out of a rollback."""
    prefix = VERSION_AUDIT_TAG.format(alias=alias) + "."
    events = []
    for key, value in model_tags.items():
        if not key.startswith(prefix) or not key.removeprefix(prefix).isdigit():
            continue
        try:
            obj = json.loads(value)
            events.append(AuditEvent(**{**obj, "seq": int(key.removeprefix(prefix))}))
        except (ValueError, TypeError):
            continue
    return sorted(events, key=lambda e: e.seq)


def next_seq(events: list[AuditEvent]) -> int:
    return max((e.seq for e in events), default=0) + 1


def holder_stack(events: list[AuditEvent]) -> list[str]:
    """Replay the trail into the stack of holders (last = most recent).

    promote pushes (seeding with its 'previous' holder when the trail starts there, so the
    first rollback can return to a holder the flow set without an event); rollback pops back
    to the version it moved to.
    """
    stack: list[str] = []
    for e in events:
        if e.action == "promote":
            if not stack and e.previous is not None:
                stack.append(e.previous)
            if not stack or stack[-1] != e.version:
                stack.append(e.version)
        else:
            while stack and stack[-1] != e.version:
                stack.pop()
            if not stack:
                stack.append(e.version)
    return stack


def rollback_target(events: list[AuditEvent], current: str | None) -> str | None:
    """Where a rollback goes: the most recent earlier holder that is not the current one."""
    stack = holder_stack(events)
    while stack and stack[-1] == current:
        stack.pop()
    return stack[-1] if stack else None


def format_trail(model: str, alias: str, events: list[AuditEvent]) -> str:
    """What ``temper models history`` prints: one line per event, oldest first."""
    if not events:
        return f"{model}@{alias}: no audit events"
    lines = [f"{model}@{alias}: {len(events)} event(s)"]
    for e in events:
        prev = f"v{e.previous}" if e.previous else "unset"
        flags = " FORCED" if e.forced else ""
        # the flow's reason already quotes the gate ("post_training gate: <gate>"): say it once
        gate = f"  gate: {e.gate}" if e.gate and e.gate not in e.reason else ""
        lines.append(f"#{e.seq} {e.time} {e.action}{flags} {prev} -> v{e.version} by {e.by}: {e.reason}{gate}")
    return "\n".join(lines)
