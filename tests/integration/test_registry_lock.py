"""The registry lock (``temper.registry.lock.model_lock``) under real contention: separate
processes, each with its own MLflow client and store connection, taking and releasing the lock
of one model over and over, on the embedded sqlite store and on an MLflow server.

Inside the lock each process reads a counter tag and writes it back plus one: any overlap of two
holders loses an increment, and any failure to take the lock is reported.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import in_env, store_processes

MODEL = "locked-model"
PROCESSES, ROUNDS = 6, 15


def _hammer(uri: str, rounds: int, barrier, out) -> None:
    from mlflow.tracking import MlflowClient

    from temper.registry.lock import model_lock

    c = MlflowClient(tracking_uri=uri, registry_uri=uri)
    barrier.wait(timeout=300)
    errors = []
    for _ in range(rounds):
        try:
            with model_lock(c, MODEL, timeout=120):
                n = int(c.get_registered_model(MODEL).tags.get("counter", "0"))
                c.set_registered_model_tag(MODEL, "counter", str(n + 1))
        except Exception as e:  # reported to the parent, asserted there
            errors.append(f"{type(e).__name__}: {e}")
    out.put(errors)


@pytest.fixture(params=["sqlite", "server"])
def registry_uri(request, tmp_path):
    return request.getfixturevalue("mlflow_server") if request.param == "server" else f"sqlite:///{tmp_path}/mlflow.db"


@pytest.mark.slow
def test_lock_holders_never_overlap_and_contention_is_never_an_error(registry_uri):
    """Was: RegistryOpError "cannot take the registry lock ...: Registered Model ... not found" when
    a holder released the lock between a waiter's failed create and MLflow's lookup of the name."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=registry_uri, registry_uri=registry_uri)
    c.create_registered_model(MODEL, tags={"counter": "0"})
    ctx = store_processes("temper.registry.lock", __name__)
    barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=in_env, args=(dict(os.environ), _hammer, registry_uri, ROUNDS, barrier, out))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    errors = [e for _ in procs for e in out.get(timeout=900)]
    for p in procs:
        p.join(60)
    assert errors == []
    assert c.get_registered_model(MODEL).tags["counter"] == str(PROCESSES * ROUNDS)  # no overlap lost an increment
    assert not [m for m in c.search_registered_models() if m.name.startswith("temper-lock.")]
