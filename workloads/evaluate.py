"""Eval job: greedy completions for one domain's eval split, scored by the domain's verifier.

Runs as a plain process (locally, or as a Kubernetes eval Job, one per shard); no Prefect.
Writes a JSON result with per-sample rewards, so later comparisons can bootstrap intervals.

    python -m workloads.evaluate --model DIR --domain NAME --out results.json [--limit 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from temper.lifecycle import EvalSettings


@dataclass
class EvalResult:
    domain: str
    model: str
    dataset_uri: str
    dataset_sha256: str
    n: int
    scored: int
    mean_reward: float
    pass_rate: float
    rewards: list[float | None] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def generate_completions(model_dir: str, prompts: list[str], max_new_tokens: int, batch_size: int = 16) -> list[str]:
    """Greedy decoding, left-padded batches; returns only the new text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    out: list[str] = []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            enc = tok(prompts[i:i + batch_size], return_tensors="pt", padding=True)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            out.extend(tok.batch_decode(new, skip_special_tokens=True))
    return out


def rollout_completions(model_dir: str, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy completions from the rollout backend (TEMPER_ROLLOUT_*: the embedded engine or vLLM).

    Unset TEMPER_ROLLOUT_MODEL_DIR / BASE_URL means: serve ``model_dir`` with the embedded engine.
    """
    import os

    from temper.rollout.client import RolloutClient, generate
    from temper.rollout.config import RolloutSettings

    overrides = {} if os.environ.get("TEMPER_ROLLOUT_BASE_URL") or os.environ.get("TEMPER_ROLLOUT_MODEL_DIR") \
        else {"model_dir": model_dir}
    client = RolloutClient(RolloutSettings(**overrides))
    try:
        return [group[0].text for group in generate(prompts, max_tokens=max_new_tokens, temperature=0.0,
                                                    client=client)]
    finally:
        client.close()


async def _score_all(verifier, records: list[dict], completions: list[str]):
    return await asyncio.gather(*(verifier.ascore(r, c) for r, c in zip(records, completions)))


# The flow's eval settings are the defaults here too (one default per knob: 8 tokens, not 32).
DEFAULTS = EvalSettings()


def evaluate_domain(model_dir: str, domain_name: str, catalog_dir: str | None = None, limit: int = DEFAULTS.limit,
                    max_new_tokens: int = DEFAULTS.max_new_tokens, keep_samples: int = 5,
                    generator: str = "local") -> EvalResult:
    from temper.catalog import load_catalog
    from temper.datasets import load_dataset
    from temper.settings import get_settings
    from temper.verifiers import get_verifier

    settings = get_settings()
    domain = load_catalog(catalog_dir or settings.catalog_dir)[domain_name]
    ds = load_dataset(domain, settings)
    frame = ds.frame[ds.frame[domain.split.column] == domain.split.eval].head(limit)
    records = frame.to_dict(orient="records")
    t = time.perf_counter()
    prompts = [domain.render_prompt(r) for r in records]
    produce = rollout_completions if generator == "rollout" else generate_completions
    completions = produce(model_dir, prompts, max_new_tokens) if records else []
    verifier = get_verifier(domain.verifier.family, domain.verifier.params)
    verdicts = asyncio.run(_score_all(verifier, records, completions))
    rewards = [None if v is None else float(v.reward) for v in verdicts]
    scored = [r for r in rewards if r is not None]
    return EvalResult(
        domain=domain.name, model=model_dir, dataset_uri=ds.uri, dataset_sha256=ds.digest, n=len(records),
        scored=len(scored), mean_reward=sum(scored) / len(scored) if scored else 0.0,
        pass_rate=sum(r >= 1.0 - 1e-9 for r in scored) / len(scored) if scored else 0.0,
        rewards=rewards, ids=[r["id"] for r in records], wall_s=time.perf_counter() - t,
        samples=[{"id": r["id"], "prompt": p[-200:], "completion": c, "reward": w}
                 for r, p, c, w in list(zip(records, prompts, completions, rewards))[:keep_samples]],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--domain", required=True)
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--limit", type=int, default=DEFAULTS.limit)
    ap.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    ap.add_argument("--generator", choices=["local", "rollout"], default="local",
                    help="local: transformers generate here; rollout: the rollout backend (TEMPER_ROLLOUT_*)")
    ap.add_argument("--out", required=True, help="where to write the JSON result (local path or fsspec URI)")
    args = ap.parse_args(argv)
    result = evaluate_domain(args.model, args.domain, args.catalog, args.limit, args.max_new_tokens,
                             generator=args.generator)
    from infra.storage import write_bytes_atomic

    write_bytes_atomic(args.out if "://" in args.out else str(Path(args.out).resolve()),
                       json.dumps(result.to_dict()).encode())
    print(json.dumps({k: v for k, v in result.to_dict().items() if k not in ("rewards", "ids", "samples")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
