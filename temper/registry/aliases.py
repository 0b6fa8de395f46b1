"""Moving aliases on purpose: promote, rollback, and the post_training flow's own move.

- ``promote``: move an alias through the same gate as the flow unless forced, with a reason
  that stays on record. The gate always weighs the version against the champion (the policy's
  ``alias``), whichever alias moves: @staging or @canary is no reason to forget that @champion
  exists. Promoting the version that already holds the alias changes nothing and records nothing.
- ``rollback``: the fast path back when a promoted model misbehaves. No gate: the previous
  holder was already trusted, and speed matters more than a second opinion.
- ``record_flow_alias``: the flow's gate decision, recorded like a promotion, so a later
  rollback can return to the version the flow replaced.

Each runs read-trail -> move alias -> append event under the store lock (``lock.model_lock``),
so concurrent moves get distinct sequence numbers and a true 'previous'.
"""

from __future__ import annotations

import getpass
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from temper.core.errors import TrackingError
from temper.core.tag_names import AUDIT_TAG, VERSION_AUDIT_TAG
from temper.registry.audit import AuditEvent, audit_events, next_seq, rollback_target
from temper.registry.gate import GateDecision, PromotionPolicy, decide
from temper.registry.lock import model_lock
from temper.registry.samples import version_curves, version_samples
from temper.registry.store import (
    GateBlocked,
    RegistryOpError,
    aliases_of,
    client,
    mlflow_message,
    registered_model,
    version_of,
)
from temper.registry.tags import mean_rewards
from temper.registry.versions import resolve_version

MAX_REASON_CHARS = 1000  # the event must fit in one registry tag value


# ---- typed parameters (the Prefect UI renders these) -----------------------------------------

class PromoteParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(description="Registered model name.")
    version: str = Field(description="Version number (or an alias, e.g. 'candidate') to promote.")
    alias: str = Field(default="champion", description="Alias to move onto the version.")
    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS, description="Why; kept in the audit trail.")
    force: bool = Field(default=False, description="Promote even if the gate says no (recorded as forced).")
    policy: PromotionPolicy = Field(default_factory=PromotionPolicy,
                                    description="Gate thresholds; its ``alias`` names the champion the gate compares "
                                                "with (fallback_alias is ignored here).")


class RollbackParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(description="Registered model name.")
    alias: str = Field(default="champion", description="Alias to move back to its previous holder.")
    reason: str = Field(default="rollback", min_length=1, max_length=MAX_REASON_CHARS,
                        description="Why; kept in the audit trail.")


@dataclass
class AliasChange:
    model: str
    alias: str
    version: str
    previous: str | None
    changed: bool
    event: AuditEvent | None = None
    gate: GateDecision | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gate"] = self.gate.model_dump() if self.gate else None
        return d

    def summary(self) -> str:
        if not self.changed:
            return f"{self.model}@{self.alias} already on v{self.version}; nothing changed (no audit event)"
        prev = f"v{self.previous}" if self.previous else "nobody"
        line = f"{self.model}@{self.alias}: {prev} -> v{self.version} ({self.event.action} #{self.event.seq})"
        if self.gate is not None:
            line += f"; gate: {'pass' if self.gate.passed else 'FAIL (forced)'}: {self.gate.reason}"
        return line


def _check_reason(reason: str | None) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise RegistryOpError("a reason is required (--reason TEXT); it is kept in the audit trail")
    if len(reason) > MAX_REASON_CHARS:
        raise RegistryOpError(f"reason is {len(reason)} characters; at most {MAX_REASON_CHARS}")
    return reason


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _move_alias(c: Any, model: str, alias: str, version: str, previous: str | None, event: AuditEvent) -> None:
    """Set the alias, then record the event; if recording fails, put the alias back.

    Order matters: an event for a move that never happened would send a later rollback to
    a version that never held the alias.
    """
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    try:
        c.set_registered_model_alias(model, alias, version)
    except MlflowException as e:
        raise RegistryOpError(f"{model}: cannot set alias {alias!r} on v{version}: {mlflow_message(e)}") from None
    try:
        c.set_registered_model_tag(model, AUDIT_TAG.format(alias=alias, seq=event.seq), event.to_json())
        c.set_model_version_tag(model, version, VERSION_AUDIT_TAG.format(alias=alias), event.to_json())
    except MlflowException as e:
        if previous is None:
            c.delete_registered_model_alias(model, alias)
        else:
            c.set_registered_model_alias(model, alias, previous)
        raise TrackingError(f"{model}@{alias}: could not record the audit event ({mlflow_message(e)}); "
                            f"alias restored to {('v' + previous) if previous else 'unset'}") from None


def _gate(c: Any, model: str, mv: Any, held: dict[str, str], policy: PromotionPolicy) -> GateDecision:
    """The gate's decision on ``mv`` against the champion (``policy.alias``), not against the holder of
    the alias being moved: a @staging nobody holds yet does not mean there is no champion."""
    champion = held.get(policy.alias)
    if champion == version_of(mv):
        return GateDecision(passed=True, reason=f"v{champion} is @{policy.alias} itself")
    holder = c.get_model_version(model, champion) if champion else None
    return decide(mean_rewards(mv.tags), mean_rewards(holder.tags) if holder else None, policy,
                  version_samples(mv), version_samples(holder) if holder else None,
                  version_curves(mv), version_curves(holder) if holder else None)


def promote(model: str, version: str, *, reason: str, alias: str = "champion", force: bool = False,
            policy: PromotionPolicy | None = None) -> AliasChange:
    """Move ``alias`` to ``version`` if the gate (version vs the champion) passes, or if forced."""
    reason = _check_reason(reason)
    c = client()
    registered_model(c, model)
    mv = resolve_version(c, model, version)
    target = version_of(mv)
    with model_lock(c, model):
        rm = registered_model(c, model)
        current = aliases_of(rm).get(alias)
        if current == target:
            return AliasChange(model=model, alias=alias, version=target, previous=current, changed=False)
        decision = _gate(c, model, mv, aliases_of(rm), policy or PromotionPolicy())
        if not decision.passed and not force:
            on = f"v{current}" if current else "unset"
            raise GateBlocked(f"{model} v{target} -> @{alias} blocked by the gate: {decision.reason} "
                              f"(@{alias} stays {on}; --force to override)")
        event = AuditEvent(seq=next_seq(audit_events(rm.tags, alias)), action="promote", alias=alias, version=target,
                           previous=current, time=_now(), reason=reason, by=_who(), forced=not decision.passed,
                           gate=decision.reason)
        _move_alias(c, model, alias, target, current, event)
    return AliasChange(model=model, alias=alias, version=target, previous=current, changed=True, event=event,
                       gate=decision)


def record_flow_alias(c: Any, model: str, alias: str, version: str | int, *, reason: str,
                      gate: str | None = None) -> AuditEvent:
    """Set the alias the post_training flow's gate chose, with the same audit event as ``promote``."""
    with model_lock(c, model):
        rm = registered_model(c, model)
        previous = aliases_of(rm).get(alias)
        event = AuditEvent(seq=next_seq(audit_events(rm.tags, alias)), action="promote", alias=alias,
                           version=str(version), previous=previous, time=_now(), reason=reason,
                           by=f"{_who()} (post_training flow)", gate=gate)
        _move_alias(c, model, alias, str(version), previous, event)
    return event


def rollback(model: str, *, alias: str = "champion", reason: str = "rollback") -> AliasChange:
    """Move ``alias`` back to its previous holder per the audit trail; no gate."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    reason = _check_reason(reason)
    c = client()
    registered_model(c, model)
    with model_lock(c, model):
        rm = registered_model(c, model)
        current = aliases_of(rm).get(alias)
        events = audit_events(rm.tags, alias)
        target = rollback_target(events, current)
        if target is None:
            held = f"v{current}" if current else "unset"
            raise RegistryOpError(f"{model}@{alias}: no previous holder in the audit trail ({len(events)} event(s); "
                                  f"@{alias} is {held}); nothing to roll back to")
        try:
            c.get_model_version(model, target)
        except MlflowException:
            raise RegistryOpError(f"{model}@{alias}: previous holder v{target} no longer exists; "
                                  f"promote a version explicitly") from None
        event = AuditEvent(seq=next_seq(events), action="rollback", alias=alias, version=target, previous=current,
                           time=_now(), reason=reason, by=_who())
        _move_alias(c, model, alias, target, current, event)
    return AliasChange(model=model, alias=alias, version=target, previous=current, changed=True, event=event)


def audit_trail(model: str, alias: str = "champion") -> list[AuditEvent]:
    return audit_events(registered_model(client(), model).tags, alias)
