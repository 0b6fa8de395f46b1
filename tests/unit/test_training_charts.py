"""Per-domain training charts at hundreds of domains: a heat map and a table instead of 300 curves."""

from __future__ import annotations

import csv
import io
import json

from temper.training.charts import domain_heatmap_png, domain_table_csv, read_metrics
from temper.training.export import reward_curve_png


def _metrics(tmp_path, n_domains=300, steps=20):
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "loss": 0.1, "reward": 0.5}
        for i in range(4):  # 4 prompts a step, stratified over the domains
            d = f"rg-task{(step * 4 + i) % n_domains:03d}-easy"
            row[f"reward/{d}"], row[f"pass_rate/{d}"] = (step % 5) / 4, 0.25
        rows.append(row)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_heatmap_and_table_cover_every_sampled_domain(tmp_path):
    from PIL import Image

    rows = read_metrics(_metrics(tmp_path))
    png = domain_heatmap_png(rows, tmp_path / "heat.png")
    width, height = Image.open(png).size
    assert height >= 80 * 8 * 0.9  # 80 sampled domains, one readable row (~8 px) each
    table = list(csv.DictReader(io.StringIO(domain_table_csv(rows))))
    assert len(table) == 80 and all(r["steps_sampled"] == "1" for r in table)
    assert {r["domain"] for r in table} == {k.split("/", 1)[1] for r in rows for k in r if k.startswith("reward/")}


def test_reward_curve_still_renders_at_300_domains_and_one_domain_gets_no_heatmap(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    png = reward_curve_png(_metrics(tmp_path), tmp_path / "curve.png")
    assert png.exists() and plt.get_fignums() == before
    (tmp_path / "one").mkdir()
    assert domain_heatmap_png(read_metrics(_metrics(tmp_path / "one", n_domains=1)), tmp_path / "none.png") is None


def test_curriculum_weights_table_and_heatmap_over_300_domains(tmp_path):
    from PIL import Image

    from temper.training.charts import curriculum_weights_csv

    names = [f"rg-task{i:03d}-easy" for i in range(300)]
    rows = [{"step": s, "loss": 0.1, **{f"weight/{d}": (1 + (i + s) % 3) / 600 for i, d in enumerate(names)}}
            for s in range(1, 11)]
    table = list(csv.DictReader(io.StringIO(curriculum_weights_csv(rows))))
    assert len(table) == 300 * 10 and {r["domain"] for r in table} == set(names)
    assert float(table[0]["weight"]) == rows[0][f"weight/{table[0]['domain']}"]
    png = domain_heatmap_png(rows, tmp_path / "w.png", prefix="weight/", title="weights")
    assert Image.open(png).size[1] >= 300 * 8 * 0.9
    assert curriculum_weights_csv([{"step": 1, "reward/a": 1.0}]) is None  # curriculum off: no table
