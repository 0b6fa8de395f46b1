"""Deterministic starter datasets, one generator per starter domain.

Same (generator, rows, seed, params) -> same bytes, so digests are stable and a CI run
validates exactly the data a developer saw. Every record has ``id``, ``split`` and
``reference`` (the gold completion, the SFT target) plus its family's columns.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from infra.storage import exists
from temper.core.errors import DatasetError
from temper.core.settings import Settings, get_settings
from temper.data import generators_agentic, generators_long_context, generators_open_ended, generators_repair
from temper.data.datasets import dataset_digest, parse_dataset, write_dataset
from temper.data.domain import Domain
from temper.data.formats.bfcl import bfcl_frame
from temper.data.formats.humaneval import humaneval_frame
from temper.data.formats.nl2bash import vendored_frame
from temper.data.frames import seeded_frame
from temper.data.pack_data import PackResult, generate_pack_datasets
from temper.data.packs_reasoning_gym import generate_many


def arithmetic(rows: int, seed: int = 0, eval_fraction: float = 0.1, max_operand: int = 20,
               ops: str = "+-*") -> pd.DataFrame:
    def make(rng: random.Random, _: int) -> dict[str, Any]:
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        return {"question": f"{a} {op} {b}", "answer": str(answer), "reference": str(answer)}

    return seeded_frame("arith", rows, seed, eval_fraction, make)


# (name, signature args, docstring, body, test cases as (args, expected)), parameterised by k.
_FUNCTIONS: list[Callable[[int], tuple[str, str, str, str, list[tuple[str, Any]]]]] = [
    lambda k: ("add_k", "x: int", f"Return x plus {k}.", f"    return x + {k}\n",
               [(str(x), x + k) for x in (0, 1, -5, 100)]),
    lambda k: ("is_multiple", "n: int", f"Return True if n is a multiple of {k}.", f"    return n % {k} == 0\n",
               [(str(n), n % k == 0) for n in (0, k, k + 1, 3 * k, 7)]),
    lambda k: ("repeat_word", "word: str", f"Return word repeated {k} times, joined by '-'.",
               f"    return '-'.join([word] * {k})\n",
               [(repr(w), "-".join([w] * k)) for w in ("a", "hi", "xyz")]),
    lambda k: ("clamp_k", "x: int", f"Clamp x into the range [0, {k}].", f"    return max(0, min({k}, x))\n",
               [(str(x), max(0, min(k, x))) for x in (-3, 0, k // 2, k, k + 9)]),
    lambda k: ("sum_above", "xs: list", f"Sum the elements of xs that are greater than {k}.",
               f"    return sum(x for x in xs if x > {k})\n",
               [(repr(xs), sum(x for x in xs if x > k)) for xs in ([], [k, k + 1], [1, 2, 30, 40], [k + 5] * 3)]),
    lambda k: ("count_char", "s: str", f"Count occurrences of the letter {chr(97 + k % 26)!r} in s.",
               f"    return s.count({chr(97 + k % 26)!r})\n",
               [(repr(s), s.count(chr(97 + k % 26))) for s in ("", "banana", "abcabc" * k, "zzz")]),
]


def python_functions(rows: int, seed: int = 0, eval_fraction: float = 0.1) -> pd.DataFrame:
    def make(rng: random.Random, _: int) -> dict[str, Any]:
        k = rng.randint(2, 9)
        name, args, doc, body, cases = rng.choice(_FUNCTIONS)(k)
        prompt = f'def {name}({args}):\n    """{doc}"""\n'
        test = "def check(candidate):\n" + "".join(
            f"    assert candidate({a}) == {e!r}\n" for a, e in cases
        )
        return {"prompt": prompt, "canonical_solution": body, "test": test, "entry_point": name,
                "reference": body}

    return seeded_frame("pyfn", rows, seed, eval_fraction, make)


_VENDORS = ["Acme Tools GmbH", "Blue River Foods", "Nordlicht Media", "Sierra Parts Inc.", "Kato Electric"]
_CURRENCIES = ["EUR", "USD", "GBP", "JPY"]
_LAYOUTS = [
    "INVOICE\nVendor: {vendor}\nInvoice No.: {invoice_number}\nDate: {date}\n\nItems\n{items}\n\nTotal due: {total} {currency}\n",
    "{vendor}\nTax invoice #{invoice_number}, issued {date}.\n{items}\nAmount payable ({currency}): {total}\n",
    "Bill from {vendor}\n---\nref {invoice_number} | {date}\n{items}\n---\nTOTAL {currency} {total}\n",
]


def invoice_extraction(rows: int, seed: int = 0, eval_fraction: float = 0.1) -> pd.DataFrame:
    def make(rng: random.Random, _: int) -> dict[str, Any]:
        items = [(rng.choice(["bolts", "paper", "cable", "coffee", "license"]), rng.randint(1, 9),
                  round(rng.uniform(1, 200), 2)) for _ in range(rng.randint(1, 4))]
        total = round(sum(q * p for _, q, p in items), 2)
        fields = {
            "invoice_number": f"INV-{rng.randint(1000, 99999)}",
            "date": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "vendor": rng.choice(_VENDORS),
            "currency": rng.choice(_CURRENCIES),
            "total": total,
        }
        lines = "\n".join(f"- {name} x{q} @ {p:.2f}" for name, q, p in items)
        document = rng.choice(_LAYOUTS).format(items=lines, **{**fields, "total": f"{total:.2f}"})
        expected = json.dumps(fields, sort_keys=True)
        return {"document": document, "expected": expected, "reference": expected}

    return seeded_frame("inv", rows, seed, eval_fraction, make)


_TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}},
    {"name": "convert_currency", "description": "Convert an amount between currencies.",
     "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "source": {"type": "string"},
                    "target": {"type": "string"}}, "required": ["amount", "source", "target"]}},
    {"name": "set_timer", "description": "Start a countdown timer.",
     "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}},
    {"name": "search_flights", "description": "Find flights between two airports on a date.",
     "parameters": {"type": "object", "properties": {"origin": {"type": "string"}, "destination": {"type": "string"},
                    "date": {"type": "string"}}, "required": ["origin", "destination", "date"]}},
]
_CITIES = ["Berlin", "Lima", "Osaka", "Nairobi", "Oslo", "Quito"]
_AIRPORTS = ["BER", "LIM", "KIX", "NBO", "OSL", "UIO"]


def _call(rng: random.Random) -> tuple[str, str, dict[str, Any], dict[str, list[Any]]]:
    """One (tool, query text, arguments, BFCL allowed values) for a random tool."""
    tool = rng.choice(_TOOLS)["name"]
    if tool == "get_weather":
        city, unit = rng.choice(_CITIES), rng.choice(["celsius", "fahrenheit"])
        return tool, f"what's the weather in {city} in {unit}", {"city": city, "unit": unit}, \
            {"city": [city], "unit": [unit]}
    if tool == "convert_currency":
        amt, src, dst = rng.randint(1, 500), *rng.sample(_CURRENCIES, 2)
        return tool, f"convert {amt} {src} to {dst}", {"amount": amt, "source": src, "target": dst}, \
            {"amount": [amt, float(amt)], "source": [src], "target": [dst]}
    if tool == "set_timer":
        m = rng.randint(1, 90)
        return tool, f"set a timer for {m} minutes", {"minutes": m}, {"minutes": [m]}
    o, d = rng.sample(_AIRPORTS, 2)
    date = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return tool, f"find flights from {o} to {d} on {date}", {"origin": o, "destination": d, "date": date}, \
        {"origin": [o], "destination": [d], "date": [date]}


def tool_calls(rows: int, seed: int = 0, eval_fraction: float = 0.1, parallel_fraction: float = 0.2) -> pd.DataFrame:
    def make(rng: random.Random, _: int) -> dict[str, Any]:
        n = 2 if rng.random() < parallel_fraction else 1
        calls = []
        for _ in range(n):
            name, query, args, allowed = _call(rng)
            calls.append((query, name, args, allowed))
        offered = sorted({c[1] for c in calls} | {rng.choice(_TOOLS)["name"]})
        query = " and ".join(c[0] for c in calls)
        return {
            "query": query[0].upper() + query[1:] + ".",
            "functions": json.dumps([t for t in _TOOLS if t["name"] in offered], sort_keys=True),
            "ground_truth": json.dumps([{c[1]: c[3]} for c in calls], sort_keys=True),
            "reference": json.dumps([{"name": c[1], "arguments": c[2]} for c in calls], sort_keys=True),
        }

    return seeded_frame("tool", rows, seed, eval_fraction, make)


_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]


def _shell_task(rng: random.Random) -> tuple[str, str, str, str]:
    kind = rng.randrange(4)
    w, n = rng.choice(_WORDS), rng.randint(2, 6)
    if kind == 0:
        return (f"Create a file named {w}.txt containing exactly the line '{w} {n}'.", "",
                f'[ "$(cat {w}.txt)" = "{w} {n}" ]', f"echo '{w} {n}' > {w}.txt")
    if kind == 1:
        return (f"Rename draft.txt to {w}.md without changing its content.",
                f"printf '{w}\\n' > draft.txt",
                f'[ ! -e draft.txt ] && [ "$(cat {w}.md)" = "{w}" ]', f"mv draft.txt {w}.md")
    if kind == 2:
        return ("Write the number of lines of data.csv into count.txt.",
                f"seq 1 {n * 3} > data.csv",
                f'[ "$(tr -d "[:space:]" < count.txt)" = "{n * 3}" ]', "wc -l < data.csv > count.txt")
    return ("Delete every .log file in logs/ but keep the other files.",
            f"mkdir -p logs && for i in $(seq 1 {n}); do echo x > logs/$i.log; echo y > logs/$i.keep; done",
            f'[ -z "$(ls logs/*.log 2>/dev/null)" ] && [ "$(ls logs | wc -l)" = "{n}" ]', "rm -f logs/*.log")


def shell_tasks(rows: int, seed: int = 0, eval_fraction: float = 0.1) -> pd.DataFrame:
    def make(rng: random.Random, _: int) -> dict[str, Any]:
        instruction, setup, check, solution = _shell_task(rng)
        return {"instruction": instruction, "setup": setup, "check": check, "reference": solution}

    return seeded_frame("sh", rows, seed, eval_fraction, make)


def reasoning_gym(rows: int, seed: int = 0, eval_fraction: float = 0.1, task: str = "", tier: str = "default",
                  name: str = "") -> pd.DataFrame:
    """One reasoning_gym pack domain (temper.data.packs), generated in a worker with a pinned hash seed.

    `temper data generate` generates pack domains in bulk instead (temper.data.pack_data: parallel,
    cached, contract-checked); this is the one-domain path every other caller gets.
    """
    if not task:
        raise DatasetError("reasoning_gym generator needs generator_params.task (pack domains set it)")
    name = name or f"rg-{task}-{tier}"
    with tempfile.TemporaryDirectory(prefix="temper-rg-") as tmp:
        out = str(Path(tmp) / "rows.jsonl")
        reply = generate_many([{"domain": name, "task": task, "tier": tier, "rows": rows, "seed": seed,
                                "eval_fraction": eval_fraction, "out": out}], processes=1)[name]
        if not reply["ok"]:
            raise DatasetError(f"reasoning_gym {task} tier {tier}: generation failed: {reply['error']}")
        return parse_dataset(Path(out).read_bytes(), "jsonl", out)


def long_context(rows: int, seed: int = 0, eval_fraction: float = 1.0, family: str = "retrieval",
                 lengths: list[int] = list(generators_long_context.DEFAULT_LENGTHS),
                 depths: list[float] = list(generators_long_context.DEFAULT_DEPTHS), tokenizer: str = "tiny") -> pd.DataFrame:
    """Long-context items of one family, lengths counted with ``tokenizer`` (``tiny`` or a model folder)."""
    try:
        count = generators_long_context.token_counter(tokenizer)
    except OSError as e:
        raise DatasetError(f"generator long_context: tokenizer {tokenizer!r} cannot be loaded: {e}") from None
    try:
        return generators_long_context.long_context_frame(rows, seed, count, family, lengths, depths, eval_fraction)
    except ValueError as e:
        raise DatasetError(f"generator long_context: {e}") from None


# Public benchmarks: the data comes from an installed package through temper/data/formats (imported
# only when generated, so loading the catalog never imports them).
def humaneval(rows: int, seed: int = 0, eval_fraction: float = 1.0, **params: Any) -> pd.DataFrame:
    return humaneval_frame(rows, seed, eval_fraction, **params)


def bfcl(rows: int, seed: int = 0, eval_fraction: float = 1.0, **params: Any) -> pd.DataFrame:
    return bfcl_frame(rows, seed, eval_fraction, **params)


def nl2bash(rows: int, seed: int = 0, eval_fraction: float = 1.0, **params: Any) -> pd.DataFrame:
    return vendored_frame(rows, seed, eval_fraction, **params)


# Multi-step domains (episodes in environments): temper/data/generators_agentic.py and generators_repair.py.
def file_tasks(rows: int, seed: int = 0, eval_fraction: float = 0.1) -> pd.DataFrame:
    return generators_agentic.file_tasks(rows, seed, eval_fraction)


def ledger_tasks(rows: int, seed: int = 0, eval_fraction: float = 0.1) -> pd.DataFrame:
    return generators_agentic.ledger_tasks(rows, seed, eval_fraction)


def repair_tasks(rows: int, seed: int = 0, eval_fraction: float = 0.1, **tier: Any) -> pd.DataFrame:
    """Repository repair (temper/data/generators_repair.py); ``tier``: modules, bugs, cross_module."""
    try:
        return generators_repair.repair_tasks(rows, seed, eval_fraction, **tier)
    except ValueError as e:
        raise DatasetError(str(e)) from None


# The one list of generators: a domain's dataset.generator names one of these.
GENERATORS: dict[str, Callable[..., pd.DataFrame]] = {
    "arithmetic": arithmetic,
    "python_functions": python_functions,
    "invoice_extraction": invoice_extraction,
    "tool_calls": tool_calls,
    "shell_tasks": shell_tasks,
    "summaries": generators_open_ended.summaries,
    "reasoning_gym": reasoning_gym,
    "long_context": long_context,
    "humaneval": humaneval,
    "bfcl": bfcl,
    "nl2bash": nl2bash,
    "file_tasks": file_tasks,
    "ledger_tasks": ledger_tasks,
    "repair_tasks": repair_tasks,
}


def generate(name: str, rows: int, seed: int, eval_fraction: float, params: dict[str, Any]) -> pd.DataFrame:
    try:
        fn = GENERATORS[name]
    except KeyError:
        raise DatasetError(f"unknown generator {name!r}; known: {', '.join(sorted(GENERATORS))}") from None
    try:
        return fn(rows=rows, seed=seed, eval_fraction=eval_fraction, **params)
    except TypeError as e:
        raise DatasetError(f"generator {name}: bad generator_params {params}: {e}") from None


def generate_domain_dataset(domain: Domain, settings: Settings | None = None, overwrite: bool = False) -> tuple[str, str, bool]:
    """Write a starter domain's dataset to the store; returns (uri, digest, written).

    An existing file is kept unless ``overwrite``: generation is deterministic, so
    rewriting only matters after the generator or its parameters changed.
    """
    settings = settings or get_settings()
    if not domain.dataset.generator:
        raise DatasetError(f"domain {domain.name} has no dataset.generator; its data is brought, not generated")
    uri = domain.dataset_uri(settings.resolved_storage_root)
    if exists(uri, settings) and not overwrite:
        return uri, dataset_digest(domain, settings), False
    frame = generate(domain.dataset.generator, domain.dataset.rows, domain.dataset.seed,
                     domain.split.eval_fraction, domain.dataset.generator_params)
    uri, digest = write_dataset(domain, frame, settings)
    return uri, digest, True


def generate_datasets(domains: list[Domain], settings: Settings | None = None, *, overwrite: bool = False,
                      processes: int = 2, progress=None) -> list:
    """Every generated dataset of ``domains`` written (or kept): one ``PackResult`` per domain, in input
    order, each also handed to ``progress`` as soon as it is known. Single-file domains go one by one,
    pack domains together (in parallel, cached by their spec, each checked against its contract
    before it is written). Brought datasets are skipped."""
    settings = settings or get_settings()
    show = progress or (lambda _result: None)
    results = {}
    for d in domains:
        if d._pack or not d.dataset.generator:
            continue
        uri, digest, written = generate_domain_dataset(d, settings, overwrite)
        results[d.name] = PackResult(d.name, uri, "written" if written else "kept", digest)
        show(results[d.name])
    packed = [d for d in domains if d._pack]
    if packed:
        for r in generate_pack_datasets(packed, settings, overwrite=overwrite, processes=processes, progress=show):
            if r.status == "kept":  # generated ones were shown as they arrived
                show(r)
            results[r.domain] = r
    return [results[d.name] for d in domains if d.name in results]
