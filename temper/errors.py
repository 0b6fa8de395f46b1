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


class TrackingError(TemperError):
    """The MLflow tracking server cannot be reached or refused a write."""
