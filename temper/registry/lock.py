"""A mutex held in the tracking store itself, around every alias move.

An alias move reads the trail (next sequence number, current holder), moves the alias, then
appends the event. Two promotions at once would both read seq N and write ``...<N+1>``: one
event lost, the other's 'previous' wrong. MLflow has no compare-and-set on tags, but creating a
registered model is atomic and unique by name in every store (a primary key in the sqlite and
SQL stores, the same through the REST server), so the lock *is* a registered model,
``temper-lock.<model>``: created to acquire, deleted to release. It works for the embedded store
and a shared server alike, across processes and machines, with nothing else to run.

A lock left by a crashed process is broken after ``STALE_AFTER_S`` (its creation time is on it).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from temper.core.tag_names import TAG_LOCK_OWNER, TAG_LOCK_SINCE
from temper.registry.store import NOT_FOUND_CODES, RegistryOpError, mlflow_message

LOCK_PREFIX = "temper-lock."
STALE_AFTER_S = 120.0
TIMEOUT_S = 60.0


def lock_name(model: str) -> str:
    return f"{LOCK_PREFIX}{model}"


def _try_create(c: Any, name: str, token: str) -> bool:
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    try:
        c.create_registered_model(name, tags={TAG_LOCK_OWNER: token, TAG_LOCK_SINCE: f"{time.time():.3f}"},
                                  description="temper: held while an alias of the model moves; deleted after")
        return True
    except MlflowException as e:
        # Held by someone else: RESOURCE_ALREADY_EXISTS; sqlite busy: "database is locked". Also "not
        # found": on a duplicate name MLflow's SQL store looks the existing model up (is it a prompt?),
        # and when its holder released the lock in between, that lookup fails. Retry all three.
        held = e.error_code == "RESOURCE_ALREADY_EXISTS" or e.error_code in NOT_FOUND_CODES
        if held or "database is locked" in mlflow_message(e):
            return False
        raise RegistryOpError(f"cannot take the registry lock {name!r}: {mlflow_message(e)}") from None


def _break_if_stale(c: Any, name: str, stale_after: float) -> None:
    """Delete the lock if its holder took it over ``stale_after`` seconds ago (a crashed process).

    A lock without its ``since`` tag is not stale: it is one read mid-change. MLflow's SQL store
    reads a model's row and then its tags in a second query (``subqueryload``), so a lock released
    between the two reads as a row with no tags. Taking that as "since 0" deleted the next holder's
    live lock and let two holders in (6 processes x 15 rounds lost 3 of 90 increments made under
    the lock). The owner is read again just before deleting, so a lock taken again meanwhile is
    not the one deleted.
    """
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    try:
        tags = c.get_registered_model(name).tags
        since, owner = tags.get(TAG_LOCK_SINCE), tags.get(TAG_LOCK_OWNER)
        if since is None or owner is None or time.time() - float(since) <= stale_after:
            return
        if c.get_registered_model(name).tags.get(TAG_LOCK_OWNER) == owner:
            c.delete_registered_model(name)
    except MlflowException as e:
        if e.error_code not in NOT_FOUND_CODES:  # released meanwhile: fine
            raise RegistryOpError(f"cannot inspect the registry lock {name!r}: {mlflow_message(e)}") from None


@contextmanager
def model_lock(c: Any, model: str, *, timeout: float = TIMEOUT_S, stale_after: float = STALE_AFTER_S) -> Iterator[None]:
    """Hold ``temper-lock.<model>`` for the duration of the block (blocking, up to ``timeout`` seconds)."""
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    name, token = lock_name(model), uuid.uuid4().hex
    deadline = time.monotonic() + timeout
    while not _try_create(c, name, token):
        _break_if_stale(c, name, stale_after)
        if time.monotonic() > deadline:
            raise RegistryOpError(f"{model}: another registry operation has held {name!r} for over {timeout:.0f}s; "
                                  f"retry, or delete that registered model if no operation is running")
        time.sleep(random.uniform(0.02, 0.2))
    try:
        yield
    finally:
        try:  # only our own lock: after ours was broken as stale, the lock there is someone else's
            if c.get_registered_model(name).tags.get(TAG_LOCK_OWNER) == token:
                c.delete_registered_model(name)
        except MlflowException:
            pass  # broken as stale by someone else; nothing to release
