"""Every read and write of data goes through fsspec: local paths by default, s3:// via s3fs.

The S3 endpoint and credential source come from settings, so the same code talks to AWS,
MinIO or a moto server on loopback.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from temper.core.errors import StorageError
from temper.core.settings import Settings, get_settings


def storage_options(uri: str, settings: Settings | None = None) -> dict[str, Any]:
    """fsspec options for ``uri``; empty for local paths."""
    settings = settings or get_settings()
    if not uri.startswith("s3://"):
        return {}
    opts: dict[str, Any] = {}
    if settings.s3_endpoint_url:
        opts["client_kwargs"] = {"endpoint_url": settings.s3_endpoint_url}
    if settings.s3_credentials == "anonymous":
        opts["anon"] = True
    elif settings.s3_credentials == "profile":
        opts["profile"] = settings.s3_profile
    # Fail fast on an unreachable endpoint instead of botocore's minutes of retries.
    opts["config_kwargs"] = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 2}}
    return opts


T = TypeVar("T")


def retrying(call: Callable[[], T], what: str, budget_s: float, log: Callable[[str], None] = print) -> T:
    """``call()`` again and again (1, 2, 4 ... 15 s apart) until it succeeds or ``budget_s`` has passed.

    For checkpoint uploads, which must outlive a store outage of a stated length. botocore's own
    retry config counts attempts with random jitter and covers only S3, so the wait is bounded here
    by time, for every fsspec backend. A missing local file is not an outage and is raised at once.
    """
    deadline, delay = time.monotonic() + budget_s, 1.0
    while True:
        try:
            return call()
        except FileNotFoundError:
            raise
        except Exception as e:
            reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            left = deadline - time.monotonic()
            if left <= 0:
                raise StorageError(f"{what}: the store failed for {budget_s:.0f} s ({reason})") from None
            wait = min(delay, left, 15.0)
            log(f"temper: store unreachable during {what} ({reason}); retrying in {wait:.0f} s")
            time.sleep(wait)
            delay *= 2


def get_fs(uri: str, settings: Settings | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem for ``uri`` and the path inside it."""
    fs, path = fsspec.core.url_to_fs(uri, **storage_options(uri, settings))
    return fs, path


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


def exists(uri: str, settings: Settings | None = None) -> bool:
    fs, path = get_fs(uri, settings)
    try:
        return fs.exists(path)
    except Exception as e:  # botocore/aiohttp raise many types for one cause: endpoint down
        raise StorageError(f"cannot reach store for {uri}: {type(e).__name__}: {e}") from None


def write_bytes_atomic(uri: str, data: bytes, settings: Settings | None = None) -> None:
    """Write via a temporary name and rename, so readers never see half a file.

    S3 uploads are already all-or-nothing, so they are written directly.
    """
    fs, path = get_fs(uri, settings)
    try:
        if uri.startswith("s3://"):
            fs.pipe_file(path, data)
            return
        fs.makedirs(fs._parent(path), exist_ok=True)
        tmp = f"{path}.tmp"
        fs.pipe_file(tmp, data)
        fs.mv(tmp, path)
    except StorageError:
        raise
    except Exception as e:
        raise StorageError(f"cannot write {uri}: {type(e).__name__}: {e}") from None


def put_dir(local_dir: str, uri: str, settings: Settings | None = None) -> None:
    """Upload (or copy) a local directory tree to ``uri``."""
    fs, path = get_fs(uri, settings)
    try:
        fs.put(local_dir.rstrip("/") + "/", path.rstrip("/") + "/", recursive=True)
    except Exception as e:
        raise StorageError(f"cannot copy {local_dir} to {uri}: {type(e).__name__}: {e}") from None


def local_folder(uri: str, settings: Settings | None = None) -> str:
    """A folder (an HF model) as a local path: local paths as they are, any other URI copied once into
    ``<home>/cache/folders/<hash of the URI>`` (a write-once location: the flow's exports never change)."""

    if "://" not in uri or uri.startswith("file://"):
        return uri.removeprefix("file://")
    settings = settings or get_settings()
    target = settings.home.resolve() / "cache" / "folders" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if not target.is_dir():
        fs, path = get_fs(uri, settings)
        tmp = target.with_suffix(f".partial-{os.getpid()}")
        try:
            fs.get(path.rstrip("/") + "/", str(tmp) + "/", recursive=True)
        except Exception as e:
            raise StorageError(f"cannot copy {uri} here: {type(e).__name__}: {e}") from None
        Path(tmp).rename(target)
    return str(target)
