"""Long-context eval data: the answer sits in a long prompt at a controlled depth, and the prompt is
exactly as long as asked, counted with the model's own tokenizer.

Three families, each asking for something that only reading the context gives:
- ``retrieval``: an access code stated once in long filler prose, with distractor codes of other
  vaults elsewhere, so answering from the wrong place scores 0;
- ``cross_file``: a generated Python project where a name is followed through three files
  (an import alias, then a constant defined by another module's constant, then its literal value),
  among distractor modules that define look-alike names;
- ``tool_history``: a long chat transcript of tool calls, where the answer is in one tool result
  many turns back, among results for other orders.

Every row records its target length, its real token count (``context_tokens``, the whole prompt
re-encoded) and the real depth of the needed fact (its offset over the prompt's length), so eval
results can be cut by length (``temper.lifecycle.effective_context``). Same (family, rows, seed,
params) -> same bytes: nothing here depends on the hash seed, the machine or the time.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

FAMILIES = ("retrieval", "cross_file", "tool_history")
# 448: the shortest length the tiny model (512 positions) reads with the eval's new tokens
DEFAULT_LENGTHS = (448, 1024, 2048, 4096, 8192)
DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
LENGTH_TOLERANCE = 0.01  # a prompt's real token count is within 1% of its target

_ADJ = ["quiet", "amber", "hollow", "northern", "gentle", "rusty", "silver", "narrow", "distant", "patient"]
_NOUN = ["river", "lantern", "orchard", "harbor", "meadow", "engine", "library", "bridge", "garden", "tower"]
_VERB = ["crosses", "faces", "shelters", "follows", "outlasts", "borders", "mirrors", "guards", "circles"]
_PLACE = ["old mill", "east gate", "market square", "stone wall", "valley road", "clock house", "north field"]
_COLORS = ["red", "blue", "green", "violet", "golden", "black", "white", "orange", "grey", "crimson", "teal"]
_ANIMALS = ["falcon", "otter", "badger", "heron", "lynx", "marten", "raven", "bison", "gecko", "walrus", "ibis"]
_WORDS = ["alpha", "bravo", "cedar", "delta", "ember", "fjord", "grove", "haven", "iris", "juniper", "kestrel"]


@dataclass
class Item:
    """One row before fitting: filler units, the facts placed among them (the needed one first, then
    distractors, each at a relative position), the question and its answer."""

    filler: list[str]
    facts: list[tuple[float, str]]
    question: str
    answer: str
    header: str
    separator: str
    pad_source: str  # text that carries no fact; a prefix of it tops the prompt up to its length

    def render(self, n_units: int, pad_chars: int) -> tuple[str, int]:
        """(prompt, character offset of the needed fact) with ``n_units`` filler units and facts inserted."""
        # a fact goes before the filler unit at its index; facts on one index keep their order of position
        placed = [((j, 1, 0.0), u) for j, u in enumerate(self.filler[:n_units])]
        placed += [((min(n_units, int(pos * n_units)), 0, pos), text) for pos, text in self.facts]
        units = [text for _, text in sorted(placed, key=lambda p: p[0])]
        key_index = units.index(self.facts[0][1])
        pad = self.pad_source[:pad_chars] + "\n" if pad_chars else ""
        head = self.header + pad
        before = head + "".join(u + self.separator for u in units[:key_index])
        return f"{head}{self.separator.join(units)}\n\nQuestion: {self.question}\nAnswer:", len(before)


def _filler_sentence(rng: random.Random) -> str:
    return (f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.choice(_VERB)} the {rng.choice(_ADJ)} "
            f"{rng.choice(_NOUN)} near the {rng.choice(_PLACE)}.")


def _prose(rng: random.Random, chars: int) -> str:
    text = ""
    while len(text) < chars:
        text += _filler_sentence(rng) + " "
    return text[:chars]


def _code(rng: random.Random) -> str:
    return f"{rng.randrange(10**5, 10**6)}"


def _distractor_spots(rng: random.Random, depth: float, k: int) -> list[float]:
    """Relative positions for ``k`` distractor facts, none on the needed fact's own spot."""
    spots = []
    while len(spots) < k:
        pos = round(rng.random(), 3)
        if abs(pos - depth) > 0.05:
            spots.append(pos)
    return spots


def _retrieval(rng: random.Random, n_units: int, depth: float, pad_chars: int) -> Item:
    names = rng.sample([f"{c} {a}" for c in _COLORS for a in _ANIMALS], 3)
    codes = [_code(rng) for _ in names]
    facts = [(depth, f"The access code for the {names[0]} vault is {codes[0]}.")]
    facts += [(pos, f"The access code for the {n} vault is {c}.")
              for pos, n, c in zip(_distractor_spots(rng, depth, 2), names[1:], codes[1:])]
    return Item([_filler_sentence(rng) for _ in range(n_units)], facts,
                f"What is the access code for the {names[0]} vault?", codes[0],
                "Read the notes below.\n\n", " ", _prose(rng, pad_chars))


def _module(rng: random.Random, name: str) -> str:
    return (f"### file: pkg/{name}.py\n"
            f"def {rng.choice(_WORDS)}_{rng.choice(_NOUN)}(items):\n"
            f"    \"\"\"Return the {rng.choice(_ADJ)} items.\"\"\"\n"
            f"    return [x for x in items if x]\n")


def _cross_file(rng: random.Random, n_units: int, depth: float, pad_chars: int) -> Item:
    """THRESHOLD in module A is an alias of module B's constant, whose literal value is the answer; a decoy
    module defines both names with other values."""
    word, other = rng.sample(_WORDS, 2)
    a, b, decoy = rng.sample([f"{x}_{n}" for x in _ADJ for n in _NOUN], 3)
    const, value = f"{word.upper()}_LIMIT", _code(rng)
    value_file = f"### file: pkg/{b}.py\n{const} = {value}\n{other.upper()}_LIMIT = {_code(rng)}\n"
    alias_file = f"### file: pkg/{a}.py\nfrom pkg.{b} import {const} as BASE\n\nTHRESHOLD = BASE\n"
    decoy_file = f"### file: pkg/{decoy}.py\nTHRESHOLD = {_code(rng)}\n{const} = {_code(rng)}\n"
    spots = _distractor_spots(rng, depth, 2)
    facts = [(depth, value_file), (spots[0], alias_file), (spots[1], decoy_file)]
    return Item([_module(rng, f"util_{i}") for i in range(n_units)], facts,
                f"What is the value of THRESHOLD in pkg/{a}.py?", value,
                "A Python project follows, file by file.\n\n", "\n", "# " + _prose(rng, pad_chars))


def _turn(rng: random.Random, order: int, tracking: str) -> str:
    status = rng.choice(["shipped", "packed", "delayed", "held"])
    return (f"user: Order {order}?\nassistant: get_order({order})\n"
            f"tool: {{\"order\": {order}, \"status\": \"{status}\", \"tracking\": \"{tracking}\"}}\n")


def _chat(rng: random.Random) -> str:
    return f"user: Any news about the {rng.choice(_ADJ)} {rng.choice(_NOUN)}?\nassistant: {_filler_sentence(rng)}\n"


def _tool_history(rng: random.Random, n_units: int, depth: float, pad_chars: int) -> Item:
    orders = rng.sample(range(1000, 10000), 3)
    tracks = [f"ZX-{_code(rng)}" for _ in orders]
    facts = [(depth, _turn(rng, orders[0], tracks[0]))]
    facts += [(pos, _turn(rng, o, t)) for pos, o, t in zip(_distractor_spots(rng, depth, 2), orders[1:], tracks[1:])]
    return Item([_chat(rng) for _ in range(n_units)], facts, f"What was the tracking code of order {orders[0]}?",
                tracks[0], "Chat log:\n\n", "",
                "user: a note. " + _prose(rng, pad_chars))


_BUILD: dict[str, Callable[[random.Random, int, float, int], Item]] = {
    "retrieval": _retrieval, "cross_file": _cross_file, "tool_history": _tool_history}


def _largest(fits: Callable[[int], bool], limit: int, guess: int = 1) -> int:
    """The largest n in [0, limit] with fits(n), given fits(0), searched outwards from ``guess`` (the
    caller's estimate from the tokenizer's characters per token: a good guess costs two or three
    encodes of the prompt instead of a bisection's dozen). A BPE tokenizer's count is monotone in the
    text only roughly, so the caller checks the result against the tolerance."""
    guess = max(0, min(guess, limit))
    if fits(guess):
        lo, step = guess, 1
        while lo + step <= limit and fits(lo + step):
            lo, step = lo + step, step * 2
        hi = min(lo + step - 1, limit)
    else:
        hi, step = guess - 1, 1
        while hi - step > 0 and not fits(hi - step):
            hi, step = hi - step, step * 2
        lo = max(0, hi - step)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class _TooFewUnits(Exception):
    """The row's filler does not reach its length: build it again with more."""


def _fit(item: Item, target: int, count: Callable[[str], int], chars_per_token: float) -> tuple[str, int, int]:
    """(prompt, fact offset, tokens): the most filler units that fit under ``target`` tokens, then a
    prefix of the padding text grown until the prompt is as long as it can be without passing it."""
    bare = count(item.render(0, 0)[0])
    if bare > target:
        raise ValueError(f"the facts and the question alone need more than {target} tokens")
    unit_chars = sum(map(len, item.filler[:16])) / min(16, len(item.filler)) + len(item.separator)
    guess = int((target - bare) * chars_per_token / unit_chars)
    n_units = _largest(lambda n: count(item.render(n, 0)[0]) <= target, len(item.filler), guess)
    if n_units == len(item.filler):
        raise _TooFewUnits(f"{len(item.filler)} filler units do not reach {target} tokens")
    short = count(item.render(n_units, 0)[0])
    guess = int((target - short) * chars_per_token)
    pad = _largest(lambda n: count(item.render(n_units, n)[0]) <= target, len(item.pad_source), guess)
    prompt, offset = item.render(n_units, pad)
    return prompt, offset, count(prompt)


def long_context_frame(rows: int, seed: int, count: Callable[[str], int], family: str = "retrieval",
                       lengths: list[int] | tuple[int, ...] = DEFAULT_LENGTHS,
                       depths: list[float] | tuple[float, ...] = DEFAULT_DEPTHS, eval_fraction: float = 1.0) -> pd.DataFrame:
    """``rows`` items cycling over the (length, depth) grid, lengths fastest, so the first
    len(lengths) x len(depths) rows (what an eval ``limit`` takes) cover every cell."""
    if family not in _BUILD:
        raise ValueError(f"unknown long-context family {family!r}; known: {', '.join(FAMILIES)}")
    if not lengths or any(int(n) < 64 for n in lengths):
        raise ValueError(f"lengths must be token counts of at least 64, got {list(lengths)}")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"depths must be fractions in [0, 1], got {list(depths)}")
    sample = " ".join(_filler_sentence(random.Random(k)) for k in range(20))
    chars_per_token = len(sample) / max(1, count(sample))
    records: list[dict[str, Any]] = []
    for i in range(rows):
        target = int(lengths[i % len(lengths)])
        depth = float(depths[(i // len(lengths)) % len(depths)])
        # enough filler units for the target at this tokenizer's rate (units are >= 40 characters), doubled
        # until they overfill it; each row has its own seed, so rows do not depend on each other
        units, item = int(target * chars_per_token / 40) + 16, None
        while item is None:
            rng = random.Random(f"long-context:{family}:{seed}:{i}:{units}")
            item = _BUILD[family](rng, units, depth, 1024)
            try:
                prompt, offset, tokens = _fit(item, target, count, chars_per_token)
            except _TooFewUnits:
                units, item = units * 2, None
        records.append({
            "id": f"lc-{family}-{seed}-{i:06d}", "family": family, "prompt": prompt, "answer": item.answer,
            "reference": item.answer, "target_tokens": target, "context_tokens": tokens,
            "target_depth": depth, "depth": round(offset / len(prompt), 4),
            "split": "eval" if rng.random() < eval_fraction else "train"})
    return pd.DataFrame.from_records(records)


def token_counter(tokenizer: str = "tiny") -> Callable[[str], int]:
    """Token count of a text with the model's own tokenizer: ``tiny`` (temper's character tokenizer) or
    the folder of a Hugging Face model. Special tokens are not counted: lengths are the text's."""
    # lazy: transformers (0.8 s) only when long-context data is generated
    from transformers import AutoTokenizer

    from temper.core.tokenizer import build_tokenizer

    tok = build_tokenizer() if tokenizer == "tiny" else AutoTokenizer.from_pretrained(tokenizer)
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])
