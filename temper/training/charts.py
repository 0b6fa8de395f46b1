"""Per-domain views of a run's metrics that a person can read at hundreds of domains.

``metrics.jsonl`` holds, per logged step, ``reward/<domain>`` for the domains sampled in that step
(and, with the GRPO curriculum on, ``weight/<domain>`` for every domain). At two domains a line per
domain is readable; at 300 it is not, so a run also gets a domain x step heat map (blank where a
domain was not sampled) and one table row per domain, and the same for the curriculum's weights.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

MAX_CURVES = 10  # past this many domains the reward curve shows the overall reward only


def read_metrics(metrics_jsonl: str | Path) -> list[dict]:
    path = Path(metrics_jsonl)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def domain_names(rows: list[dict], prefix: str = "reward/") -> list[str]:
    return sorted({k.split("/", 1)[1] for r in rows for k in r if k.startswith(prefix)})


def domain_table_csv(rows: list[dict]) -> str:
    """domain, steps it was sampled in, mean of its per-step reward, first and last reward, pass rate."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["domain", "steps_sampled", "mean_reward", "first_reward", "last_reward", "mean_pass_rate"])
    for d in domain_names(rows):
        seen = [r for r in rows if f"reward/{d}" in r]
        rewards = [r[f"reward/{d}"] for r in seen]
        passes = [r[f"pass_rate/{d}"] for r in seen if f"pass_rate/{d}" in r]
        writer.writerow([d, len(seen), f"{sum(rewards) / len(rewards):.4f}", f"{rewards[0]:.4f}", f"{rewards[-1]:.4f}",
                         f"{sum(passes) / len(passes):.4f}" if passes else ""])
    return out.getvalue()


def curriculum_weights_csv(rows: list[dict]) -> str | None:
    """step, domain, weight: the curriculum's sampling weights over time (long form, one row per pair)."""
    names = domain_names(rows, "weight/")
    if not names:
        return None
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["step", "domain", "weight"])
    for r in rows:
        for d in names:
            if f"weight/{d}" in r:
                writer.writerow([r["step"], d, r[f"weight/{d}"]])
    return out.getvalue()


def domain_heatmap_png(rows: list[dict], out_png: str | Path, prefix: str = "reward/",
                       title: str = "mean reward per domain and step (blank: not sampled)") -> Path | None:
    """Domain (rows) x step (columns) of one per-domain metric (the mean reward by default, 0..1 scale;
    any other is scaled to its own maximum); None when fewer than two domains logged it."""
    names = domain_names(rows, prefix)
    steps = sorted({r["step"] for r in rows if "step" in r and any(k.startswith(prefix) for k in r)})
    if len(names) < 2 or not steps:
        return None
    # lazy: matplotlib (600 ms) would load in fast unit tests (test_domain_roles.py)
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib+numpy (700 ms) would load in fast unit tests (test_domain_roles.py)
    import matplotlib.pyplot as plt
    import numpy as np

    col = {s: i for i, s in enumerate(steps)}
    grid = np.full((len(names), len(steps)), np.nan)
    for r in rows:
        for i, d in enumerate(names):
            if f"{prefix}{d}" in r:
                grid[i, col[r["step"]]] = r[f"{prefix}{d}"]
    height = min(60.0, max(3.0, 0.12 * len(names)))  # ~8 px a domain at 70 dpi, capped
    fig, ax = plt.subplots(figsize=(max(6.0, 0.25 * len(steps)), height))
    vmax = 1.0 if prefix == "reward/" else float(np.nanmax(grid)) or 1.0
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest", vmin=0.0, vmax=vmax,
                      cmap="viridis")
    ax.set_xlabel("step")
    ax.set_ylabel("domain")
    ax.set_xticks(range(0, len(steps), max(1, math.ceil(len(steps) / 20))))
    ax.set_xticklabels([steps[i] for i in range(0, len(steps), max(1, math.ceil(len(steps) / 20)))])
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=6 if len(names) > 40 else 8)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    fig.savefig(out_png, dpi=70)
    plt.close(fig)
    return Path(out_png)
