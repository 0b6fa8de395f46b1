"""User-facing errors. The CLI prints them as one line and exits non-zero; anything else is a bug."""


class TemperError(Exception):
    """Base of every error caused by user input or the outside world."""


class CatalogError(TemperError):
    """A domain file or the catalog directory is wrong."""


class ContractError(TemperError):
    """A data contract file is wrong (not: the data violates it; that is a validation result)."""


class DatasetError(TemperError):
    """A dataset is missing, unreadable or does not match its declared format."""


class StorageError(TemperError):
    """The store (local path or S3 endpoint) cannot be reached or written."""


class TrainingError(TemperError):
    """A training config, checkpoint or resume request is wrong, or the machine cannot run it."""


class TrackingError(TemperError):
    """The MLflow tracking server cannot be reached or refused a write."""


class TrackingUnreachable(TrackingError):
    """The tracking server stayed unreachable for the whole retry budget: retrying at once is pointless."""


def describe_validation_error(source: object, err) -> str:
    """'<file>: field '<a.b>': <reason>' from a pydantic ValidationError: the one format of every config error."""
    errors = err.errors()
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: field '{loc}': {first['msg']}{more}"


class ContractViolation(TemperError):
    """A dataset broke its data contract: the lifecycle stops before any compute is spent."""
