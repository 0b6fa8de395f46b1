"""Multi-domain rewards: each sample is scored by its own domain's verifier, concurrently.

The GRPO dataset carries two extra columns, ``domain`` and ``record`` (the source record
as JSON), which TRL passes to reward functions as per-sample lists. A verifier may answer
``None`` ("cannot judge this record"): that stays ``None`` and TRL drops it from the
advantage instead of pretending it scored 0. The domain's ``reward_weight`` multiplies the
verdict's reward. All verdicts of a batch are awaited together (``asyncio.gather`` over
``ascore``), so slow or sandboxed verifiers overlap instead of running one by one.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from temper.core.chat import chat_prompt
from temper.data.domain import Domain
from temper.verifiers.registry import get_verifier


def completion_text(completion: Any) -> str:
    """TRL gives strings for plain prompts and message lists for conversational ones."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


class DomainRewards:
    """A TRL reward function (callable) over a mix of domains, with per-domain running stats."""

    __name__ = "domain_reward"

    def __init__(self, domains: list[Domain], pass_threshold: float = 1.0) -> None:
        self.domains = {d.name: d for d in domains}
        self.verifiers = {d.name: get_verifier(d.verifier.family, d.verifier.params) for d in domains}
        self.pass_threshold = pass_threshold
        self.reset_stats()

    def reset_stats(self) -> None:
        self.stats: dict[str, dict[str, float]] = defaultdict(lambda: {"n": 0, "sum": 0.0, "passed": 0, "none": 0})
        self.groups: dict[int, list] = {}  # stream slot -> [domain, its completions' rewards] (curriculum runs)

    async def ascore_all(self, domains: list[str], records: list[dict], texts: list[str],
                         given: list[float | None] | None = None) -> list[float | None]:
        """``given``: rewards already decided per sample (a multi-turn episode's end-state check,
        ``temper.training.multiturn``); those samples are counted, not scored again."""
        given = given or [None] * len(texts)

        async def one(name: str, record: dict, text: str, reward: float | None) -> float | None:
            if reward is not None:
                return reward
            verdict = await self.verifiers[name].ascore(record, text)
            return None if verdict is None else verdict.reward

        raw = await asyncio.gather(*(one(d, r, t, g) for d, r, t, g in zip(domains, records, texts, given)))
        out: list[float | None] = []
        for name, reward in zip(domains, raw):
            s = self.stats[name]
            if reward is None:
                s["none"] += 1
                out.append(None)
                continue
            s["n"] += 1
            s["sum"] += reward
            s["passed"] += reward >= self.pass_threshold
            out.append(reward * self.domains[name].reward_weight)
        return out

    def __call__(self, prompts: list[Any], completions: list[Any], domain: list[str], record: list[str],
                 slot: list[int] | None = None, episode_reward: list[float | None] | None = None,
                 **_: Any) -> list[float | None]:
        records = [json.loads(r) if isinstance(r, str) else r for r in record]
        texts = [completion_text(c) for c in completions]
        rewards = asyncio.run(self.ascore_all(list(domain), records, texts, episode_reward))
        for index, name, reward in zip(slot or [], domain, rewards):  # a group = the completions of one slot
            self.groups.setdefault(int(index), [name, []])[1].append(reward)
        return rewards

    def summary(self) -> dict[str, dict[str, float]]:
        return {name: dict(s) for name, s in self.stats.items()}


def merge_summaries(parts: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """Combine per-rank stats into metrics: reward/<domain>, pass_rate/<domain>, none_rate/<domain>."""
    total: dict[str, dict[str, float]] = defaultdict(lambda: {"n": 0, "sum": 0.0, "passed": 0, "none": 0})
    for part in parts:
        for name, s in part.items():
            for k, v in s.items():
                total[name][k] += v
    metrics: dict[str, float] = {}
    for name, s in sorted(total.items()):
        if s["n"]:
            metrics[f"reward/{name}"] = s["sum"] / s["n"]
            metrics[f"pass_rate/{name}"] = s["passed"] / s["n"]
        seen = s["n"] + s["none"]
        if seen:
            metrics[f"none_rate/{name}"] = s["none"] / seen
    return metrics


def step_totals(parts: list[dict[str, dict[str, float]]], group_parts: list[dict[int, list]]) -> dict[str, list[int]]:
    """One step's per-rank stats -> {domain: [scored, passed, groups, groups with signal]} over all ranks.

    A group is one slot's completions (a slot's group may be split over ranks, so groups are joined
    by slot first); it has signal when its judged rewards are not all equal (GRPO's advantage is then
    not zero). Integers, so every rank that sums the same gathered parts gets the same totals.
    """
    total: dict[str, list[int]] = {}
    for part in parts:
        for name, s in part.items():
            row = total.setdefault(name, [0, 0, 0, 0])
            row[0] += int(s["n"])
            row[1] += int(s["passed"])
    joined: dict[int, list] = {}
    for part in group_parts:
        for index, (name, rewards) in part.items():
            joined.setdefault(index, [name, []])[1].extend(rewards)
    for name, rewards in joined.values():
        judged = [r for r in rewards if r is not None]
        if len(judged) >= 2:
            row = total.setdefault(name, [0, 0, 0, 0])
            row[2] += 1
            row[3] += max(judged) - min(judged) > 1e-6
    return dict(sorted(total.items()))


def greedy_mean_reward(model_dir: str, domains: list[Domain], frames: dict[str, Any], max_new_tokens: int = 8,
                       limit: int = 64, batch_size: int = 32) -> dict[str, float]:
    """Mean (unweighted) verifier reward of greedy completions on each domain's eval split.

    Single process, plain transformers: this is how a result is judged outside training.
    """
    # lazy: torch (1.5 s) would load in fast unit tests (test_domain_roles.py)
    import torch

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    scorer = DomainRewards(domains)
    result: dict[str, float] = {}
    for d in domains:
        frame = frames[d.name]
        rows = frame[frame[d.split.column] == d.split.eval].head(limit).to_dict(orient="records")
        rewards: list[float] = []
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            enc = tok([chat_prompt(tok, d.render_prompt(r)) for r in chunk], return_tensors="pt", padding=True)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            verdicts = asyncio.run(scorer.ascore_all([d.name] * len(chunk), chunk, texts))
            rewards += [0.0 if v is None else v / (d.reward_weight or 1.0) for v in verdicts]
        result[d.name] = sum(rewards) / max(len(rewards), 1)
    return result
