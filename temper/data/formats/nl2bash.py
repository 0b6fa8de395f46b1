"""NL2Bash-style pairs (an English description, a bash one-liner) -> shell_tasks records.

NL2Bash ships line-aligned ``*.nl`` / ``*.cm`` files and has no end-state checks: most of its
commands *print* an answer. So a record gets a fixed fixture ``setup`` (a small tree of files
to work on) and an empty ``check``; such domains use the terminal family with ``mode: output``,
which compares what the completion prints with what the reference prints on the same fixture.

No package ships NL2Bash, so a 102-pair subset of its corpus is vendored under its MIT licence in
``temper/data/formats/data/nl2bash`` (SOURCE.md says where from and how the pairs were chosen: each
reference runs on FIXTURE and prints something that tells it from a wrong command).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from temper.core.errors import DatasetError
from temper.data.formats import stable_split

VENDORED = Path(__file__).parent / "data" / "nl2bash"

# A small, deterministic tree with a few file types, sizes and a nested dir.
FIXTURE = """mkdir -p src/lib docs logs
printf 'alpha\\nbeta\\ngamma\\n' > docs/readme.txt
printf 'print(1)\\n' > src/main.py
printf 'def f():\\n    return 2\\n' > src/lib/util.py
printf 'error: disk\\nok\\nerror: net\\n' > logs/app.log
head -c 2048 /dev/zero > logs/big.bin
"""
def to_records(pairs: list[tuple[str, str]], prefix: str = "nl2bash", eval_fraction: float = 0.1,
               setup: str = FIXTURE) -> list[dict[str, Any]]:
    records = []
    for i, (nl, cmd) in enumerate(pairs):
        if not nl.strip() or not cmd.strip():
            raise DatasetError(f"{prefix} pair {i}: empty description or command")
        rid = f"{prefix}-{i:06d}"
        records.append({"id": rid, "split": stable_split(rid, eval_fraction), "instruction": nl.strip(),
                        "setup": setup, "check": "", "reference": cmd.strip()})
    return records


def load_pairs(nl_path: str | Path, cm_path: str | Path) -> list[tuple[str, str]]:
    nl = Path(nl_path).read_text().splitlines()
    cm = Path(cm_path).read_text().splitlines()
    if len(nl) != len(cm):
        raise DatasetError(f"{nl_path} has {len(nl)} lines but {cm_path} has {len(cm)}: they must be line-aligned")
    return list(zip(nl, cm))


def load_nl2bash(nl_path: str | Path, cm_path: str | Path, eval_fraction: float = 0.1) -> list[dict[str, Any]]:
    return to_records(load_pairs(nl_path, cm_path), eval_fraction=eval_fraction)


def vendored_frame(rows: int, seed: int = 0, eval_fraction: float = 1.0) -> pd.DataFrame:
    """The first ``rows`` pairs of the vendored subset, in file order (``seed`` unused)."""
    records = load_nl2bash(VENDORED / "subset.nl", VENDORED / "subset.cm", eval_fraction)
    if rows > len(records):
        raise DatasetError(f"NL2Bash subset has {len(records)} pairs, domain asks for rows={rows}")
    return pd.DataFrame.from_records(records[:rows])
