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
        c.create_registered_model(name, tags={"temper.lock.owner": token, "temper.lock.since": f"{time.time():.3f}"},
                                  description="temper: held while an alias of the model moves; deleted after")
        return True
    except MlflowException as e:
        if e.error_code == "RESOURCE_ALREADY_EXISTS" or "locked" in mlflow_message(e):  # sqlite busy: retry
            return False
        raise RegistryOpError(f"cannot take the registry lock {name!r}: {mlflow_message(e)}") from None


def _break_if_stale(c: Any, name: str, stale_after: float) -> None:
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    try:
        since = float(c.get_registered_model(name).tags.get("temper.lock.since", "0"))
        if time.time() - since > stale_after:
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
        try:
            c.delete_registered_model(name)
        except MlflowException:
            pass  # broken as stale by someone else; nothing to release
