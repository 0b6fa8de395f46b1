"""The eval summary on a model version: ``temper.eval.<domain>.<metric>`` tags.

The one writer (``eval_tags``) and the one parser (``parse_eval_tags``); the gate, ``temper
models``, the lineage graph and the evaluate flow all read versions through the parser, so a
domain name with dots (``code.v2``) or a hand-edited tag means the same thing everywhere.
"""

from __future__ import annotations

from typing import Any

from temper.core.tag_names import EVAL_PREFIX, EVAL_TAG

METRICS = ("mean_reward", "pass_rate", "n")


def eval_tags(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    """domain -> result (with mean_reward, pass_rate, n) -> version tags."""
    return {EVAL_TAG.format(domain=domain, metric=m): str(r[m]) for domain, r in results.items() for m in METRICS}


def parse_eval_tags(tags: dict[str, str]) -> dict[str, dict[str, float]]:
    """``temper.eval.<domain>.<metric>`` tags -> domain -> metric -> value (domain may contain dots;
    ``n``, a count, is an int).

    Only the known metrics count (so ``temper.eval.label`` on a run, or any other tag under the
    prefix, is not mistaken for a domain); unreadable values are skipped.
    """
    out: dict[str, dict[str, float]] = {}
    for key, value in tags.items():
        if not key.startswith(EVAL_PREFIX):
            continue
        domain, _, metric = key.removeprefix(EVAL_PREFIX).rpartition(".")
        if not domain or metric not in METRICS:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        # a count is an int (tags are strings: "64" or, from older writers, "64.0")
        out.setdefault(domain, {})[metric] = int(number) if metric == "n" and number.is_integer() else number
    return dict(sorted(out.items()))


def mean_rewards(tags: dict[str, str]) -> dict[str, float]:
    """The gate's input: domain -> mean reward."""
    return {d: m["mean_reward"] for d, m in parse_eval_tags(tags).items() if "mean_reward" in m}
