"""The parity gate of the fast profile, and registering both serving profiles in MLflow.

A fast variant may only serve if it changes nothing but speed: on an eval prompt set its greedy
tokens must equal the standard profile's, token for token. The gate runs both engines over the
same prompts (one request at a time, so the timing is per-request decode speed, after a warm-up
request each), compares the token ids and records the measured speed-up. A single differing token
fails it. ``register_serving_profiles`` writes the standard and fast profiles as two versions of
one registered model; the fast alias is set only when the gate passed, otherwise the version is
kept for the record under ``<alias>-blocked`` and ``ParityFailed`` is raised.
"""

from __future__ import annotations

import json
import time
from typing import Any

from mlflow.tracking import MlflowClient
from pydantic import BaseModel, Field

from temper.core.errors import TemperError
from temper.core.tag_names import PARITY_TAG, TAG_SERVING_DRAFT, TAG_SERVING_PROFILE, TAG_SERVING_STANDARD_VERSION
from temper.registry.registration import ensure_registered_model
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine


class ParityFailed(TemperError):
    """The fast variant's greedy output differs from the standard profile's."""


class Mismatch(BaseModel):
    prompt_index: int
    first_diff_at: int
    standard: str
    fast: str


class ParityReport(BaseModel):
    passed: bool
    reason: str
    prompts: int
    tokens: int = Field(description="Greedy tokens generated per profile over the prompt set.")
    mismatches: list[Mismatch] = Field(default_factory=list)
    standard_s: float
    fast_s: float
    speedup: float = Field(description="standard_s / fast_s, measured in this run (identical outputs only).")

    def tags(self) -> dict[str, str]:
        fields = {"passed": str(self.passed).lower(), "reason": self.reason[:500], "prompts": str(self.prompts),
                  "tokens": str(self.tokens), "mismatches": str(len(self.mismatches)),
                  "speedup": f"{self.speedup:.3f}", "standard_s": f"{self.standard_s:.3f}",
                  "fast_s": f"{self.fast_s:.3f}"}
        return {PARITY_TAG.format(field=k): v for k, v in fields.items()}


def _run(engine: Engine, prompts: list[str], params: SamplingParams) -> tuple[list[list[int]], float]:
    engine.generate(prompts[:1], params)  # warm-up: first-call overheads are not the profile's speed
    t0 = time.perf_counter()
    out = [engine.generate([p], params)[0].token_ids[0] for p in prompts]
    return out, time.perf_counter() - t0


def parity_gate(standard: Engine, fast: Engine, prompts: list[str], max_tokens: int = 32) -> ParityReport:
    """Greedy outputs of ``fast`` must equal ``standard``'s on every prompt; returns the decision and speed-up."""
    if not prompts:
        raise ValueError("parity gate needs at least one eval prompt")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ref, t_std = _run(standard, prompts, params)
    got, t_fast = _run(fast, prompts, params)
    tok = standard.tokenizer
    mismatches = []
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mismatches.append(Mismatch(prompt_index=i, first_diff_at=at, standard=tok.decode(a), fast=tok.decode(b)))
    tokens = sum(len(a) for a in ref)
    speedup = t_std / t_fast if t_fast > 0 else 0.0
    if mismatches:
        m = mismatches[0]
        reason = (f"{len(mismatches)}/{len(prompts)} prompts diverge; first: prompt {m.prompt_index} at token "
                  f"{m.first_diff_at}")
    else:
        reason = f"identical greedy output on {len(prompts)} prompts ({tokens} tokens); speed-up {speedup:.2f}x"
    return ParityReport(passed=not mismatches, reason=reason, prompts=len(prompts), tokens=tokens,
                        mismatches=mismatches, standard_s=t_std, fast_s=t_fast, speedup=speedup)


def require_parity(report: ParityReport) -> ParityReport:
    if not report.passed:
        raise ParityFailed(f"fast profile blocked by the parity gate: {report.reason}")
    return report


def register_serving_profiles(model_name: str, source: str, report: ParityReport, *, draft: str,
                              run_id: str | None = None, alias: str = "serving") -> dict[str, Any]:
    """Two versions of ``model_name``: ``<alias>-standard`` and, if the gate passed, ``<alias>-fast``.

    MLflow must already point at the tracking store (``infra.tracking.connection.configure``).
    """
    client = MlflowClient()
    ensure_registered_model(client, model_name)
    std = client.create_model_version(name=model_name, source=source, run_id=run_id,
                                      tags={TAG_SERVING_PROFILE: "standard"})
    client.set_registered_model_alias(model_name, f"{alias}-standard", std.version)
    fast_alias = f"{alias}-fast" if report.passed else f"{alias}-fast-blocked"
    fast = client.create_model_version(
        name=model_name, source=source, run_id=run_id,
        tags={TAG_SERVING_PROFILE: "fast", TAG_SERVING_DRAFT: draft, TAG_SERVING_STANDARD_VERSION: str(std.version),
              **report.tags(),
              PARITY_TAG.format(field="detail"): json.dumps([m.model_dump() for m in report.mismatches[:5]])})
    client.set_registered_model_alias(model_name, fast_alias, fast.version)
    out = {"standard": {"version": std.version, "alias": f"{alias}-standard"},
           "fast": {"version": fast.version, "alias": fast_alias, "passed": report.passed,
                    "speedup": report.speedup}}
    if not report.passed:
        raise ParityFailed(f"{model_name} v{fast.version} (fast) recorded as {fast_alias}, not served: {report.reason}")
    return out
