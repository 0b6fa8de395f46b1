"""What do-nothing completions earn on HumanEval, next to the canonical solutions, per code_tests mode.

For each mode (the default all-or-nothing, and opt-in partial credit) the 164 problems are scored
through temper's sandboxed verifier (warm pool, gathered like a GRPO batch) with the canonical
solutions and with stub bodies. Before the harness split the default was partial credit per
assert and a body of ``pass`` earned reward on 40 of the 164 problems (mean 0.056); the table
shows what it earns now. The canonical row's time is the cost of scoring the whole benchmark.

Run: .venv/bin/python benchmarks/humaneval_stubs.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temper.data.formats.humaneval import load_humaneval  # noqa: E402
from temper.verifiers import get_verifier  # noqa: E402

COMPLETIONS = {"canonical": None, "pass": "    pass\n", "return None": "    return None\n", "return 0": "    return 0\n",
               "return []": "    return []\n", "return True": "    return True\n", "...": "    ...\n"}


def main() -> None:
    problems = load_humaneval()
    print(f"{'mode':8} {'completion':12} {'reward>0':>8} {'reward=1':>8} {'mean':>7} {'seconds':>8}")
    for partial in (False, True):
        verifier = get_verifier("code_tests", {"timeout_s": 10, "partial": partial})
        for name, body in COMPLETIONS.items():
            completions = [p["reference"] if body is None else body for p in problems]

            async def batch():
                return await asyncio.gather(*(verifier.ascore(p, c) for p, c in zip(problems, completions)))

            start = time.monotonic()
            got = asyncio.run(batch())
            took = time.monotonic() - start
            rewards = [g.reward for g in got]
            print(f"{'partial' if partial else 'strict':8} {name:12} {sum(r > 0 for r in rewards):>8} "
                  f"{sum(r == 1 for r in rewards):>8} {sum(rewards) / len(rewards):>7.4f} {took:>8.1f}")


if __name__ == "__main__":
    main()
