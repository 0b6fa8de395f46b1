"""Reading a domain's dataset from the store, and its content digest.

The digest is the sha256 of the file's bytes, so "same digest" means "same data" whatever
the store: lineage records it, contract validation is cached by it, and retraining
compares it with the champion's.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from infra.storage import exists, get_fs, write_bytes_atomic
from temper.core.errors import DatasetError, StorageError
from temper.core.settings import Settings, get_settings
from temper.data.domain import Domain


@dataclass(frozen=True)
class LoadedDataset:
    domain: str
    uri: str
    digest: str
    frame: pd.DataFrame


@dataclass(frozen=True)
class DatasetChange:
    """A write that changed a domain's data: ``previous`` is None when there was no file."""

    domain: str
    uri: str
    previous: str | None
    sha256: str


# Called after every dataset write that changed a digest. The library knows no orchestrator:
# entry points that want an event (tasks/events.py: a Prefect event that triggers retrain) add one.
DATASET_LISTENERS: list[Callable[[DatasetChange], None]] = []


def _read_bytes(uri: str, settings: Settings) -> bytes:
    fs, path = get_fs(uri, settings)
    try:
        with fs.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DatasetError(f"dataset {uri} does not exist (run `temper data generate` for starter domains)") from None
    except PermissionError as e:
        raise DatasetError(f"dataset {uri}: permission denied: {e}") from None
    except Exception as e:  # network errors from s3fs/aiobotocore
        raise StorageError(f"cannot read dataset {uri}: {type(e).__name__}: {e}") from None


#: No post-training row needs more: a bigger one is a broken export or an attack, and would stall
#: tokenization and every verifier that reads it. (Characters; a row is a JSONL line or a parquet cell.)
MAX_ROW_CHARS = 8 * 1024 * 1024


def _too_big(uri: str, where: str, size: int) -> DatasetError:
    return DatasetError(f"dataset {uri}: {where} is {size:,} characters, over the {MAX_ROW_CHARS:,} a row may hold")


def _jsonl_rows(text: str, uri: str) -> list:
    """Each line parsed on its own, so an error names the file's own line (json.loads of one line
    would say "line 1" whatever the line)."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_ROW_CHARS:
            raise _too_big(uri, f"line {number}", len(line))
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DatasetError(f"dataset {uri} is not valid jsonl: line {number} column {e.colno}: {e.msg}") from None
    return rows


def parse_dataset(data: bytes, fmt: str, uri: str) -> pd.DataFrame:
    try:
        if fmt == "jsonl":
            return pd.DataFrame.from_records(_jsonl_rows(data.decode("utf-8"), uri))
        if fmt == "parquet":
            frame = pd.read_parquet(io.BytesIO(data))
            for column in frame.columns:
                if frame[column].dtype == object or pd.api.types.is_string_dtype(frame[column]):
                    lengths = frame[column].map(lambda v: len(v) if isinstance(v, (str, bytes)) else 0)
                    if len(lengths) and lengths.max() > MAX_ROW_CHARS:
                        raise _too_big(uri, f"column {column!r} row {int(lengths.idxmax())}", int(lengths.max()))
            return frame
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise DatasetError(f"dataset {uri} is not valid {fmt}: {e}") from None
    raise DatasetError(f"dataset {uri}: unknown format {fmt!r}")


def load_dataset(domain: Domain, settings: Settings | None = None) -> LoadedDataset:
    settings = settings or get_settings()
    uri = domain.dataset_uri(settings.resolved_storage_root)
    data = _read_bytes(uri, settings)
    frame = parse_dataset(data, domain.dataset.format, uri)
    return LoadedDataset(domain=domain.name, uri=uri, digest=hashlib.sha256(data).hexdigest(), frame=frame)


def read_dataset(domain: Domain, settings: Settings | None = None) -> pd.DataFrame:
    return load_dataset(domain, settings).frame


def dataset_digest(domain: Domain, settings: Settings | None = None) -> str:
    settings = settings or get_settings()
    uri = domain.dataset_uri(settings.resolved_storage_root)
    fs, path = get_fs(uri, settings)
    try:
        with fs.open(path, "rb") as f:
            h = hashlib.sha256()
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
            return h.hexdigest()
    except FileNotFoundError:
        raise DatasetError(f"dataset {uri} does not exist (run `temper data generate` for starter domains)") from None
    except Exception as e:
        raise StorageError(f"cannot read dataset {uri}: {type(e).__name__}: {e}") from None


def serialize_dataset(frame: pd.DataFrame, fmt: str) -> bytes:
    if fmt == "jsonl":
        return "".join(json.dumps(r, sort_keys=True) + "\n" for r in frame.to_dict(orient="records")).encode()
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def write_dataset(domain: Domain, frame: pd.DataFrame, settings: Settings | None = None) -> tuple[str, str]:
    """Write a domain's dataset to the store; returns (uri, sha256). A changed digest is announced."""
    return write_dataset_bytes(domain, serialize_dataset(frame, domain.dataset.format), settings)


def write_dataset_bytes(domain: Domain, data: bytes, settings: Settings | None = None) -> tuple[str, str]:
    """Write a domain's serialized dataset to the store; returns (uri, sha256). A changed digest is announced."""
    settings = settings or get_settings()
    uri = domain.dataset_uri(settings.resolved_storage_root)
    previous = dataset_digest(domain, settings) if exists(uri, settings) else None
    write_bytes_atomic(uri, data, settings)
    digest = hashlib.sha256(data).hexdigest()
    if digest != previous:
        for listener in DATASET_LISTENERS:
            listener(DatasetChange(domain.name, uri, previous, digest))
    return uri, digest
