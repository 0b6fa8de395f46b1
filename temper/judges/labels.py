"""Human labels as a versioned dataset: one jsonl per (domain, review session) in the store.

The version is the sha256 of the file's bytes (the file is named by it), as for every
dataset here, so a calibration run in MLflow points at exactly the labels it measured.
Labels go through their own data contract (data_contracts/human_labels.yaml) before they
are written: calibration must never read a label file that a later reader would reject.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pandas as pd

from data_contracts.model import load_contract
from data_contracts.runner import GXRunner
from infra.storage import join, write_bytes_atomic
from temper.core.errors import ContractViolation
from temper.core.settings import Settings, get_settings
from temper.data.datasets import serialize_dataset
from temper.judges.review import JudgedItem
from temper.judges.rubric import Rubric

CONTRACT = "human_labels"


def label_record(item: JudgedItem, rubric: Rubric, score: int, comment: str, flow_run_id: str) -> dict[str, Any]:
    response_sha = hashlib.sha256(item.response.encode()).hexdigest()
    return {"id": f"{item.domain}-{item.item_id}-{response_sha[:12]}", "domain": item.domain, "item_id": item.item_id,
            "prompt": item.prompt, "response": item.response, "human_score": int(score), "comment": comment,
            "scale_min": rubric.scale.min, "scale_max": rubric.scale.max, "judge_score": float(item.judge_score),
            "judge_raw_score": float(item.judge_raw_score), "judge_digest": item.digest, "judge_id": item.judge_id,
            "rubric": rubric.name, "rubric_digest": item.rubric_digest, "flow_run_id": flow_run_id}


def validate_labels(frame: pd.DataFrame, uri: str, sha256: str, settings: Settings | None = None) -> None:
    """Run the human_labels contract through GX; ContractViolation lists what failed."""
    settings = settings or get_settings()
    contract = load_contract(settings.resolved_contracts_dir / f"{CONTRACT}.yaml")
    report = GXRunner().validate(CONTRACT, contract, frame, dataset_uri=uri, digest=sha256)
    if not report.success:
        why = ", ".join(f"{f.check} on {f.column} (samples {f.sample_values})" for f in report.failures)
        raise ContractViolation(f"human labels {uri} violate contract {CONTRACT}: {why}")


def write_labels(domain: str, records: list[dict[str, Any]], settings: Settings | None = None
                 ) -> tuple[str, str, pd.DataFrame]:
    """Validate and store one session's labels; returns (uri, sha256, frame)."""
    settings = settings or get_settings()
    frame = pd.DataFrame.from_records(records)
    data = serialize_dataset(frame, "jsonl")
    sha = hashlib.sha256(data).hexdigest()
    uri = join(settings.resolved_storage_root, "human_labels", domain, f"{sha}.jsonl")
    validate_labels(frame, uri, sha, settings)
    write_bytes_atomic(uri, data, settings)
    return uri, sha, frame
