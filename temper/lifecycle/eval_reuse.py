"""A base model's eval, computed once: kept in the store under the key of everything its result depends on.

Every post_training run evaluates its base model next to the candidate. A scheduled retrain of the same base on
the same data, with the same eval settings and code, would compute exactly the same numbers again (eval is
greedy and seeded); on a real model over hundreds of domains that is the larger half of the run's eval time.
So each (model, domain) result of a base eval is written to ``<store>/evals/<key>.json`` and a later run with
the same key records that result (tagged with the run that computed it) instead of starting an eval job.

The key covers: the model's bytes (every file of the folder), the domain's dataset bytes (the digest the flow
resolved and validated), the domain's catalog entry (verifier family and parameters, prompt template), the
eval settings that change a result (limit, max_new_tokens) and the code (commit plus a hash of local edits).
Nothing is reused when any of them cannot be known: a model given as a remote URI, code outside a git
checkout, a rollout backend (what a server generates is not known by the folder's bytes). A result with
unscored items (a verifier that timed out, a sandbox error) is not kept: that may have been the machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from infra.storage import get_fs, join, write_bytes_atomic
from infra.tracking.runs import code_fingerprint
from temper.core.settings import get_settings
from temper.data.catalog import load_catalog


def model_digest(model_dir: str) -> str | None:
    """sha256 over the relative names and contents of a local model folder's files; None for a URI."""
    root = Path(model_dir)
    if "://" in model_dir or not root.is_dir():
        return None
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def reuse_keys(model_dir: str, dataset_digests: dict[str, str], limit: int, max_new_tokens: int) -> dict[str, str]:
    """Domain -> the key of its eval result, for each domain whose result can be keyed (see the module doc)."""
    code, model = code_fingerprint(), model_digest(model_dir)
    if code is None or model is None or get_settings().rollout.backend:
        return {}
    catalog = load_catalog(get_settings().catalog_dir)
    keys = {}
    for domain, digest in dataset_digests.items():
        if domain not in catalog:
            continue
        what = {"model": model, "dataset": digest, "domain": catalog[domain].model_dump(mode="json"),
                "limit": limit, "max_new_tokens": max_new_tokens, "code": code}
        keys[domain] = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    return keys


def _uri(key: str) -> str:
    return join(get_settings().resolved_storage_root, "evals", f"{key}.json")


def load_result(key: str) -> dict[str, Any] | None:
    """The kept result of ``key`` (with ``computed_by``: the eval run that computed it), or None."""
    fs, path = get_fs(_uri(key))
    if not fs.exists(path):
        return None
    return json.loads(fs.cat_file(path))


def keep_result(key: str, result: dict[str, Any], run_id: str, dataset_digest: str) -> bool:
    """Keep a freshly computed result under ``key`` (made with ``dataset_digest``); False, nothing kept, when some
    items were not scored or the job read other bytes than the key names (the dataset changed since the run
    resolved it: the result is right for the run, not for the key)."""
    if result["scored"] != result["n"] or result.get("dataset_sha256") != dataset_digest:
        return False
    write_bytes_atomic(_uri(key), json.dumps({**result, "computed_by": run_id}).encode())
    return True
