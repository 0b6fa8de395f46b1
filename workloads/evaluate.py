"""Eval job: greedy completions for a set of domains' eval splits, each scored by its own verifier.

Runs as a plain process (locally, or as a Kubernetes eval Job, one per shard); no Prefect. The
model is loaded once per process, whatever the number of domains: at hundreds of domains a
process (interpreter start + model load) per domain would cost more than the eval itself.
With a shard in its job settings (``get_settings().job``: the eval jobs' ``TEMPER_JOB``) the process
takes every ``num_shards``-th domain starting at ``shard_index``, so shards split the work without
talking to each other. Writes one JSON result per domain, ``<out>/<domain>.json``, with per-sample
rewards, so later comparisons can bootstrap intervals; where a domain ran does not show.
A multi-step domain (verifier family ``episode``) is played as episodes, turn by turn, in its
environment (``temper.agent.greedy_episodes``: greedy turns of the domain's ``turn_tokens``, up to its
``max_turns``; ``--max-new-tokens`` is for single-turn domains), and its result carries each
episode's turns, outcome and trajectory.

    python -m workloads.evaluate --model DIR --domain A --domain B --out DIR_OR_URI [--limit 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from infra.sandbox.pool import close_shared, shared_pool
from infra.storage import join, local_folder, write_bytes_atomic
from temper.agent.greedy_episodes import play_episodes
from temper.agent.kinds import ENVIRONMENTS
from temper.core.chat import chat_prompt
from temper.core.settings import get_settings
from temper.data.catalog import load_catalog, select_domains
from temper.data.datasets import load_dataset
from temper.lifecycle.params import EvalSettings
from temper.verifiers import get_verifier


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
    # prompts that do not fit the model's context with the new tokens: not generated, scored as "" (multi-step
    # domains: model turns refused so, each ending its episode as no_action)
    too_long: int = 0
    # per item, the prompt length (tokens) it was made for, on long-context domains (their rows record it): the
    # effective context length is computed from (length, reward) pairs (temper.registry.effective_context)
    context_lengths: list[int] = field(default_factory=list)
    # multi-step domains (verifier family 'episode'), per item: model turns played, how the episode ended,
    # and the whole episode as a trajectory line (temper.agent.trajectories), played turn by turn
    turns: list[int] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    trajectories: list[dict[str, Any]] = field(default_factory=list)
    # through the rollout backend: prompt tokens of the requests and those served from the server's prefix
    # cache (usage.prompt_tokens_details.cached_tokens); records that share a document reuse its KV
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    # completions scored 0 for their form before their content was judged (a verifier marks them details["format"]),
    # counted by its reason: e.g. {"no <answer> tag": 12}, how much of a score is answer format rather than the task
    zero_reasons: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LocalGenerator:
    """Greedy decoding with transformers in this process; the model is loaded once."""

    def __init__(self, model_dir: str, batch_size: int = 16) -> None:
        # lazy: torch+transformers (2.3 s) only for the runs of `-m workloads.evaluate` that need it
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.tok.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self.batch_size = batch_size
        self.too_long = 0  # prompts not generated so far (cumulative: _evaluate takes each domain's difference)

    def __call__(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        """Greedy completions; a prompt that does not fit the model's context (with ``max_new_tokens``)
        gets "" without generating: the model cannot read it, and generating past the positions it was
        built for costs memory quadratic in a length it was never meant to see (a 5k-token prompt in a
        batch of 16 took 14 GB on the 512-position tiny model)."""
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        fits = [not context or len(self.tok(p)["input_ids"]) + max_new_tokens <= context for p in prompts]
        self.too_long += fits.count(False)
        done = iter(_greedy(self.model, self.tok, [p for p, ok in zip(prompts, fits) if ok], max_new_tokens,
                            self.batch_size))
        return [next(done) if ok else "" for ok in fits]

    def close(self) -> None:
        pass


def generate_completions(model_dir: str, prompts: list[str], max_new_tokens: int, batch_size: int = 16) -> list[str]:
    """Greedy decoding, left-padded batches; returns only the new text."""
    return LocalGenerator(model_dir, batch_size)(prompts, max_new_tokens)


def _greedy(model, tok, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    # lazy: torch (1.5 s) only for the runs of `-m workloads.evaluate` that need it
    import torch

    out: list[str] = []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            enc = tok(prompts[i:i + batch_size], return_tensors="pt", padding=True)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            out.extend(tok.batch_decode(new, skip_special_tokens=True))
    return out


class RolloutGenerator:
    """Greedy completions from the rollout backend (``get_settings().rollout``: the embedded engine or vLLM).

    Rollout settings with neither ``base_url`` nor ``model_dir`` mean: serve ``model_dir`` with the embedded engine.
    """

    def __init__(self, model_dir: str) -> None:
        # lazy: torch+openai+fastapi+... (2.7 s), via client, only for the runs of `-m workloads.evaluate` that need it
        from temper.rollout.client import RolloutClient

        rollout = get_settings().rollout
        self.client = RolloutClient(**({} if rollout.base_url or rollout.model_dir else {"model_dir": model_dir}))
        self.too_long = self.prompt_tokens = self.cached_prompt_tokens = 0

    def __call__(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        groups = self.client.generate(prompts, max_new_tokens, 0.0, skip_too_long=True)
        # cumulative over calls (a multi-step eval makes one per turn; _evaluate takes each domain's difference)
        self.too_long += sum(not g for g in groups)  # refused as longer than the served context: scored as ""
        self.prompt_tokens += sum(g[0].prompt_tokens for g in groups if g)
        self.cached_prompt_tokens += sum(g[0].cached_tokens for g in groups if g)
        return [g[0].text if g else "" for g in groups]

    def close(self) -> None:
        self.client.close()


def make_generator(model_dir: str, generator: str = "local"):
    return RolloutGenerator(model_dir) if generator == "rollout" else LocalGenerator(model_dir)


async def _score_all(verifier, records: list[dict], completions: list[str]):
    return await asyncio.gather(*(verifier.ascore(r, c) for r, c in zip(records, completions)))


# The flow's eval settings are the defaults here too (one default per knob: 8 tokens, not 32).
DEFAULTS = EvalSettings()


def evaluate_domain(model_dir: str, domain_name: str, catalog_dir: str | None = None, limit: int = DEFAULTS.limit,
                    max_new_tokens: int = DEFAULTS.max_new_tokens, keep_samples: int = 5,
                    generator: str = "local") -> EvalResult:
    """One domain, with a model loaded for it (see ``evaluate_domains`` for a set)."""
    (result,) = evaluate_domains(model_dir, [domain_name], catalog_dir, limit, max_new_tokens, keep_samples, generator)
    return result


def shard_of(domains: list[str], index: int, count: int) -> list[str]:
    """This shard's domains: every ``count``-th of the sorted set, from ``index`` (no coordination needed)."""
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is not in [0, {count})")
    return sorted(set(domains))[index::count]


def evaluate_domains(model_dir: str, domain_names: list[str], catalog_dir: str | None = None,
                     limit: int = DEFAULTS.limit, max_new_tokens: int = DEFAULTS.max_new_tokens, keep_samples: int = 5,
                     generator: str = "local"):
    """Yield one EvalResult per domain, in order, loading the catalog and the model once."""
    domains = select_domains(load_catalog(catalog_dir or get_settings().catalog_dir), domain_names)
    produce = make_generator(model_dir, generator) if domains else None
    try:
        # lazy: transformers (800 ms) only for the runs of `-m workloads.evaluate` that need it
        from transformers import AutoTokenizer

        # prompts as training formats them: in the model's chat template (temper.core.chat)
        tokenizer = AutoTokenizer.from_pretrained(model_dir) if domains else None
        for domain in domains:
            yield _evaluate(produce, model_dir, domain, limit, max_new_tokens, keep_samples, tokenizer)
    finally:
        if produce is not None:
            produce.close()


def with_progress(results: Iterable[EvalResult], total: int, file: TextIO | None = None,
                  mininterval: float = 0.1) -> Iterator[EvalResult]:
    """Pass the results through, with a per-domain progress bar (done/total, rate, ETA, the last
    domain and its mean reward) on an interactive terminal. Nothing in logs and CI: tqdm's
    ``disable=None`` turns the bar off unless ``file`` (default stderr) is a TTY, which is how
    ``temper data generate/validate`` behave too; the eval task's captured output stays plain.
    ``mininterval``: at most one redraw per that many seconds (tqdm's default)."""
    bar = tqdm(total=total, desc="eval", unit="domain", disable=None, leave=False, file=file, mininterval=mininterval)
    try:
        for result in results:
            bar.set_postfix_str(f"{result.domain} {result.mean_reward:.3f}", refresh=False)
            bar.update()
            yield result
    finally:
        bar.close()


EPISODE_FAMILY = "episode"  # multi-step domains: played turn by turn (temper.agent.greedy_episodes)


COUNTERS = ("too_long", "prompt_tokens", "cached_prompt_tokens")  # a generator's running counts (0 if it keeps none)


def _counts(produce) -> dict[str, int]:
    return {name: getattr(produce, name, 0) for name in COUNTERS}


def _play(produce, domain, verifier, records: list[dict], prompts: list[str]) -> list[dict]:
    """A multi-step domain's eval: one greedy episode per record through its environment, turn by turn;
    its trajectory lines."""
    kind = domain.verifier.params.get("env", "files")
    return play_episodes(verifier.environment, kind, domain.name, records, prompts, produce,
                         int(domain.verifier.params.get("turn_tokens", 64)),
                         wave=shared_pool("shell").size if ENVIRONMENTS[kind].holds_box else 64)


def _evaluate(produce, model_dir: str, domain, limit: int, max_new_tokens: int, keep_samples: int,
              tokenizer=None) -> EvalResult:
    """One domain's eval. ``tokenizer``: the model's, whose chat template the prompts go in (``evaluate_domains``
    always passes it); None only for a scripted policy that reads the rendered prompt itself (tests)."""
    ds = load_dataset(domain, get_settings())
    frame = ds.frame[ds.frame[domain.split.column] == domain.split.eval].head(limit)
    records = frame.to_dict(orient="records")
    t = time.perf_counter()
    # as training formats them: in the model's chat template (temper.core.chat)
    prompts = [chat_prompt(tokenizer, domain.render_prompt(r)) for r in records]
    verifier = get_verifier(domain.verifier.family, domain.verifier.params)
    episodes: list[dict] = []
    zero_reasons: Counter[str] = Counter()
    before = _counts(produce)
    if domain.verifier.family == EPISODE_FAMILY:
        episodes = _play(produce, domain, verifier, records, prompts) if records else []
        completions = ["\n".join(turn["action"] for turn in e["turns"]) for e in episodes]
        rewards = [e["reward"] for e in episodes]
    else:
        completions = produce(prompts, max_new_tokens) if records else []
        verdicts = asyncio.run(_score_all(verifier, records, completions))
        rewards = [None if v is None else float(v.reward) for v in verdicts]
        zero_reasons.update(str(v.details.get("reason", "format")) for v in verdicts
                            if v is not None and v.reward == 0.0 and v.details.get("format"))
    scored = [r for r in rewards if r is not None]
    counts = {name: n - before[name] for name, n in _counts(produce).items()}  # this domain's generations
    return EvalResult(
        domain=domain.name, model=model_dir, dataset_uri=ds.uri, dataset_sha256=ds.digest, n=len(records),
        scored=len(scored), mean_reward=sum(scored) / len(scored) if scored else 0.0,
        pass_rate=sum(r >= 1.0 - 1e-9 for r in scored) / len(scored) if scored else 0.0,
        rewards=rewards, ids=[r["id"] for r in records], wall_s=time.perf_counter() - t,
        samples=[{"id": r["id"], "prompt": p[-200:], "completion": c, "reward": w}
                 for r, p, c, w in list(zip(records, prompts, completions, rewards))[:keep_samples]],
        **counts,
        context_lengths=[int(r["target_tokens"]) for r in records] if "target_tokens" in frame.columns else [],
        turns=[len(e["turns"]) for e in episodes], outcomes=[e["outcome"] for e in episodes], trajectories=episodes,
        zero_reasons=dict(sorted(zero_reasons.items())),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--domain", action="append", required=True, help="a domain to evaluate (repeatable)")
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--limit", type=int, default=DEFAULTS.limit)
    ap.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    ap.add_argument("--generator", choices=["local", "rollout"], default="local",
                    help="local: transformers generate here; rollout: the rollout backend (TEMPER_ROLLOUT_*)")
    ap.add_argument("--out", required=True, help="directory (local path or fsspec URI) for <domain>.json results")
    args = ap.parse_args(argv)
    model = local_folder(args.model)  # a store URI when the model was trained on a cluster
    job = get_settings().job
    index, count = job.shard_index, job.num_shards
    mine = shard_of(args.domain, index, count)
    out = args.out if "://" in args.out else str(Path(args.out).resolve())
    print(json.dumps({"shard": index, "shards": count, "domains": len(mine)}), flush=True)
    try:
        results = evaluate_domains(model, mine, args.catalog, args.limit, args.max_new_tokens, generator=args.generator)
        for result in with_progress(results, len(mine)):
            write_bytes_atomic(join(out, f"{result.domain}.json"), json.dumps(result.to_dict()).encode())
            # tqdm.write: the line goes above the bar (when there is one), not through it
            tqdm.write(json.dumps({k: v for k, v in result.to_dict().items()
                                   if k not in ("rewards", "ids", "samples", "turns", "outcomes", "trajectories")}),
                       file=sys.stdout)
            sys.stdout.flush()
    finally:
        close_shared()  # sandbox pods go with the job, not at interpreter exit
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
