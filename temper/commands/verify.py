"""`temper verify (--verifier NAME [--params JSON] | --domain NAME) RECORDS.jsonl`: score completions offline.

``--domain`` takes the verifier family and params from that catalog domain (pack domains too),
the same ``get_verifier(domain.verifier.family, domain.verifier.params)`` that training and eval
build, and also prints ``weighted_reward`` (times the domain's ``reward_weight``, what GRPO uses).

Each input line is a dataset record plus the completion to judge (``--completion-field``,
default ``completion``; ``--reference`` judges the record's own gold ``reference``, a quick
check that a dataset and its verifier agree). Prints one JSON line per record (id, reward,
details) and a final summary line. Records are scored concurrently (sandboxed families
through the warm pool).

A record the verifier cannot judge (no ``answer`` for numeric, a sandbox that failed) gets
``"not_judged": REASON`` instead of a reward, and the summary counts the reasons. When no record
at all was judged the command fails: a summary of nothing is not a passed check.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from temper.core.errors import CatalogError, DatasetError, TemperError
from temper.core.jsonl import json_objects
from temper.verifiers import get_verifier
from temper.verifiers.base import not_judged_reasons


def _records(path: Path) -> list[dict]:
    return [record for _, record in json_objects(path, DatasetError)]


def _completions(records: list[dict], field: str, path: Path) -> list[str]:
    missing = [i for i, r in enumerate(records, 1) if not isinstance(r.get(field), str)]
    if missing:
        raise TemperError(f"{path}: record(s) {missing[:5]} have no string field {field!r} to judge")
    return [r[field] for r in records]


def _references(verifier, records: list[dict], path: Path) -> list[str]:
    """Each record's gold reference as the verifier's family reads it (a multi-step domain's is a
    JSON list of turns, not the completion text itself)."""
    completions, bad = [], []
    for i, r in enumerate(records, 1):
        try:
            completions.append(verifier.reference_completion(r))
        except ValueError as e:
            bad.append((i, str(e)))
    if bad:
        raise TemperError(f"{path}: record(s) {[i for i, _ in bad[:5]]} have no reference to judge: {bad[0][1]}")
    return completions


async def _score_all(verifier, records: list[dict], completions: list[str], concurrency: int):
    gate = asyncio.Semaphore(concurrency)

    async def one(rec, text):
        async with gate:
            with not_judged_reasons() as why:
                verdict = await verifier.ascore(rec, text)
        if verdict is not None:
            return verdict, None
        return None, "; ".join(why) or f"the {verifier.family} verifier returned no verdict and gave no reason"

    return await asyncio.gather(*(one(r, c) for r, c in zip(records, completions)))


def _domain_verifier(args):
    """The verifier training and eval build for ``--domain`` (and the domain's reward weight)."""
    # lazy: pydantic_settings+yaml (141 ms), via settings, would load at every `temper` start-up
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog

    if args.params:
        raise TemperError("--params goes with --verifier; --domain uses the domain's own params")
    catalog = load_catalog(args.catalog or get_settings().catalog_dir)
    if args.domain not in catalog:
        raise CatalogError(f"--domain {args.domain}: no such domain in the catalog ({len(catalog)} domains; "
                           "see `temper domains list`)")
    d = catalog[args.domain]
    return get_verifier(d.verifier.family, d.verifier.params), d.reward_weight


def verify(args) -> int:
    if args.concurrency < 1:
        raise TemperError(f"--concurrency must be >= 1, got {args.concurrency}")
    weight = None
    if args.domain:
        verifier, weight = _domain_verifier(args)
    else:
        try:
            params = json.loads(args.params) if args.params else {}
        except ValueError as e:
            raise TemperError(f"--params: not JSON ({e.msg}): {args.params!r}") from None
        if not isinstance(params, dict):
            raise TemperError(f"--params: expected a JSON object, got {type(params).__name__}")
        try:
            verifier = get_verifier(args.verifier, params)
        except (KeyError, TypeError, ValueError) as e:
            raise TemperError(f"--verifier {args.verifier}: {e.args[0] if e.args else e}") from None
    records = _records(args.records)
    completions = _references(verifier, records, args.records) if args.reference else \
        _completions(records, args.completion_field, args.records)
    verdicts = asyncio.run(_score_all(verifier, records, completions, args.concurrency))
    rewards, reasons = [], Counter()
    for i, (rec, (v, why)) in enumerate(zip(records, verdicts)):
        row = {"id": rec.get("id", i), "reward": None if v is None else v.reward,
               "details": None if v is None else v.details}
        if weight is not None:
            row["weighted_reward"] = None if v is None else v.reward * weight
        if v is None:
            row["not_judged"] = why
            reasons[why] += 1
        print(json.dumps(row, default=str))
        if v is not None:
            rewards.append(v.reward)
    summary = {"records": len(records), "judged": len(rewards), "not_judged": len(records) - len(rewards),
               "not_judged_reasons": dict(reasons.most_common()),
               "mean_reward": round(sum(rewards) / len(rewards), 4) if rewards else None,
               "pass_rate": round(sum(r >= 1.0 for r in rewards) / len(rewards), 4) if rewards else None}
    print(json.dumps({"summary": summary}))
    if not rewards:
        top = f": {reasons.most_common(1)[0][0]}" if reasons else ""
        more = f" (and {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else ""
        raise TemperError(f"{args.records}: no record was judged ({len(records)} record(s)){top}{more}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("verify", help="score completions in a JSONL file with a verifier family or a domain's verifier")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--verifier", metavar="NAME", help="verifier family (numeric, code_tests, ...)")
    which.add_argument("--domain", metavar="NAME", help="a catalog domain: its own verifier family and params")
    p.add_argument("--catalog", type=Path, default=None, help="domain catalog directory for --domain (default: settings)")
    p.add_argument("--params", default=None, metavar="JSON", help="family parameters as a JSON object")
    p.add_argument("--completion-field", default="completion", help="field holding the completion to judge")
    p.add_argument("--reference", action="store_true", help="judge each record's own 'reference' field")
    p.add_argument("--concurrency", type=int, default=16, help="records scored at once")
    p.add_argument("records", type=Path, metavar="RECORDS.jsonl")
    p.set_defaults(func=verify)
