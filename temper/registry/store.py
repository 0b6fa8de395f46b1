"""MLflow client access and the registry's errors.

Versions are strings everywhere in temper: MLflow's embedded sqlite store returns
``ModelVersion.version`` (and alias targets) as ints where its REST server returns strings, and
mixing the two made equal versions compare unequal (rollback to the alias's own holder, empty
alias lists, a TypeError joining version numbers). ``version_of`` and ``aliases_of`` are the only
way the rest of the package reads them.
"""

from __future__ import annotations

from typing import Any

from temper.core.errors import TrackingError

NOT_FOUND_CODES = ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")


class RegistryError(TrackingError):
    """A model, version or alias does not exist, or a registry operation cannot be done as asked.

    A TrackingError, so callers that catch tracking failures also catch these; the message
    always names the model/version/alias at fault.
    """


class RegistryOpError(RegistryError):
    """Kept distinct so callers can tell 'the operation was refused' from 'the thing does not exist'."""


class GateBlocked(RegistryOpError):
    """The promotion gate said no, and --force was not given; no alias changed."""


def client() -> Any:
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def mlflow_message(e: Exception) -> str:
    """The first line of an MLflow error (the rest is a server stack trace)."""
    return (getattr(e, "message", None) or str(e)).splitlines()[0]


def version_of(mv: Any) -> str:
    """A model version's number as a string, whichever store returned it."""
    return str(mv.version)


def aliases_of(rm: Any) -> dict[str, str]:
    """alias -> version (strings) of a registered model."""
    return {alias: str(v) for alias, v in (rm.aliases or {}).items()}


def registered_model(c: Any, model: str) -> Any:
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.exceptions import MlflowException

    try:
        return c.get_registered_model(model)
    except MlflowException as e:
        if e.error_code in NOT_FOUND_CODES:
            raise RegistryError(f"unknown registered model {model!r} at {c.tracking_uri}") from None
        raise TrackingError(f"cannot read registered model {model!r}: {mlflow_message(e)}") from None
