"""Real training: 2 DeepSpeed ZeRO-3 ranks (gloo, CPU) started by the local launcher.

One tiny model and one pair of generated datasets per module; each test runs whole
``accelerate launch`` jobs, so these are the slowest tests of the suite (~2 min each).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from temper.training.config import nest_stage_fields
from tests.conftest import REPO, use_embedded_home

DOMAINS = ["arithmetic", "multiplication"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """TEMPER_HOME with the two datasets generated, and a tiny random base model."""
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.training.tiny import init_tiny

    root = tmp_path_factory.mktemp("train")
    with pytest.MonkeyPatch.context() as mp:
        use_embedded_home(mp, root / "home")
        catalog = load_catalog(REPO / "domains")
        for name in DOMAINS:
            generate_domain_dataset(catalog[name])
        init_tiny(root / "tiny")
        yield root
    get_settings.cache_clear()


def write_config(root: Path, name: str, **fields) -> Path:
    base = {"run_name": name, "domains": DOMAINS, "output_dir": str(root / name), "tracking": False,
            "save_steps": 1000, "seed": 0}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(nest_stage_fields({**base, **fields})))
    return path


def launch(config: Path, mode: str, stop_when: str | None = None, on_line=None) -> tuple[int, list[str]]:
    """Run the job through the local launcher; optionally cancel it when a line appears, or hand
    each line to ``on_line`` too (a test's fault injector)."""
    import threading

    from infra.launcher_local import run_job
    from temper.training.job import training_job

    lines: list[str] = []
    cancel = threading.Event()

    inject = on_line

    def on_line(line: str) -> None:
        lines.append(line)
        if inject is not None:
            inject(line)
        if stop_when and stop_when in line:
            cancel.set()

    status = run_job(training_job(str(config), mode), on_line=on_line, cancel=cancel, cwd=str(REPO))
    return status, lines


def kill_at_checkpoint_then_resume(config: Path, mode: str, step: int) -> None:
    """Run ``config`` until its step-``step`` checkpoint is synced, kill the whole process group, then
    start it again: it must resume from that checkpoint and finish."""
    status, lines = launch(config, mode, stop_when=f"checkpoint step {step} synced")
    assert status == 130, "\n".join(lines[-40:])  # cancelled: the whole process group was killed
    status, lines = launch(config, mode)
    assert status == 0, "\n".join(lines[-40:])
    assert any("resuming from" in line and f"checkpoint-{step}" in line for line in lines)


def losses(output_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}  # a resumed run re-logs: last wins


def eval_rewards(model_dir: Path) -> dict[str, float]:
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.datasets import load_dataset
    from temper.training.rewards import greedy_mean_reward

    domains = [load_catalog(REPO / "domains")[n] for n in DOMAINS]
    frames = {d.name: load_dataset(d, get_settings()).frame for d in domains}
    return greedy_mean_reward(str(model_dir), domains, frames, max_new_tokens=4, limit=64)


def test_sft_then_grpo_raises_reward_on_two_domains_and_really_shards(workspace):
    before = eval_rewards(workspace / "tiny")

    sft = write_config(workspace, "sft", mode="sft", base_model=str(workspace / "tiny"), max_steps=150,
                       learning_rate=3e-3, per_device_batch_size=16)
    status, lines = launch(sft, "sft")
    assert status == 0, "\n".join(lines[-40:])

    shards = [json.loads((workspace / "sft" / f"shards-rank{r}.json").read_text()) for r in (0, 1)]
    full = shards[0]["full_numel"]
    assert all(0 < s["local_numel"] < full for s in shards), shards  # ZeRO-3: each rank holds a part
    assert sum(s["local_numel"] for s in shards) == full

    grpo = write_config(workspace, "grpo", mode="grpo", base_model=str(workspace / "sft" / "model"),
                        max_steps=40, learning_rate=3e-4, per_device_batch_size=8, num_generations=4,
                        max_completion_length=4, temperature=0.8, beta=0.0)
    status, lines = launch(grpo, "grpo")
    assert status == 0, "\n".join(lines[-40:])
    logged = [json.loads(line) for line in (workspace / "grpo" / "metrics.jsonl").read_text().splitlines()]
    keys = {k for row in logged for k in row}
    assert {f"{m}/{d}" for m in ("reward", "pass_rate") for d in DOMAINS} <= keys, sorted(keys)
    assert {"loss", "step_time_s", "tokens_per_s"} <= keys, sorted(keys)  # "kl" only when beta > 0

    after = eval_rewards(workspace / "grpo" / "model")
    mean = lambda r: sum(r.values()) / len(r)  # noqa: E731
    # 64 greedy eval samples per domain: one standard error of the mean is ~0.04 here.
    assert mean(after) - mean(before) >= 0.15, (before, after)
    assert all(after[d] > before[d] for d in DOMAINS), (before, after)


def test_killed_run_resumes_with_identical_losses_and_refuses_changed_data(workspace):
    common = dict(mode="sft", base_model=str(workspace / "tiny"), max_steps=6, save_steps=3,
                  learning_rate=1e-3, per_device_batch_size=4)
    status, lines = launch(write_config(workspace, "straight", **common), "sft")
    assert status == 0, "\n".join(lines[-40:])

    interrupted = write_config(workspace, "interrupted", **common)
    kill_at_checkpoint_then_resume(interrupted, "sft", step=3)

    expected, resumed = losses(workspace / "straight"), losses(workspace / "interrupted")
    assert sorted(resumed) == sorted(expected) == list(range(1, 7))
    for step in expected:
        assert abs(resumed[step] - expected[step]) <= 1e-5, (step, expected, resumed)

    # The same run over changed data: refused, naming the dataset, nothing trained.
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog

    uri = load_catalog(REPO / "domains")["multiplication"].dataset_uri(get_settings().resolved_storage_root)
    path = Path(uri)
    original = path.read_bytes()
    try:
        path.write_bytes(original.replace(b'"answer": "0"', b'"answer": "00"', 1))
        assert path.read_bytes() != original
        status, lines = launch(write_config(workspace, "interrupted", **{**common, "max_steps": 9}), "sft")
    finally:
        path.write_bytes(original)
    assert status != 0
    assert any("dataset changed since the checkpoint" in line and "multiplication" in line for line in lines)


def step_metrics(output_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "loss" in r}


def test_disk_full_at_a_checkpoint_names_folder_and_bytes_and_the_previous_checkpoint_resumes(workspace):
    """The output folder is a 2.5 MiB tmpfs: checkpoint-2 (1.6 MiB for the tiny model on 2 ranks) fits,
    checkpoint-4 does not. The job fails with one line naming the folder and the sizes, removes the
    half-written checkpoint, and a restart (on a disk with room) resumes from checkpoint-2."""
    import os
    import subprocess
    import sys

    from temper.core.settings import get_settings

    config = write_config(workspace, "diskfull", mode="sft", base_model=str(workspace / "tiny"),
                          max_steps=4, save_steps=2)
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable,
                           str(Path(__file__).parent / "disk_full_job.py"), str(config), "sft", "2560k"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = json.loads(proc.stdout.strip().splitlines()[-1])
    text = "\n".join(job["lines"])
    assert job["status"] != 0
    assert "checkpoint step 2 synced" in text, "checkpoint-2 must fit in the tmpfs: " + text[-2000:]
    out = workspace / "diskfull"
    assert (f"disk full: a checkpoint could not be written to {out}: " in text
            and "removed the incomplete checkpoint-4; checkpoint-2 is complete and a restart resumes from it" in text), \
        text[-3000:]
    errors = [line for line in job["lines"] if line.startswith("temper: error: disk full")]
    assert len(errors) >= 1 and not any("[rank" in line and "RuntimeError" in line for line in job["lines"]), \
        "the ranks' torch.save failure becomes temper's one line, not a stack trace per rank"
    store = Path(get_settings().resolved_storage_root) / "runs" / "diskfull" / "checkpoints"
    assert sorted(p.name for p in store.iterdir()) == ["checkpoint-2"]

    status, lines = launch(config, "sft")  # same run name, a disk with room: continues from the store's checkpoint
    assert status == 0, "\n".join(lines[-30:])
    assert any("resuming from" in line and "checkpoint-2" in line for line in lines)
    assert sorted(losses(out)) == [3, 4]  # it continued after step 2 (steps 1-2 were logged on the lost tmpfs)


def test_grpo_curriculum_with_engine_rollouts_on_one_rank(workspace):
    """The engine's rollout used to read the whole train dataset when it was built, to index the prompts of
    multi-step domains; with the curriculum on that dataset decides each batch from rewards not yet seen,
    so the run failed before its first step ("batch 2 needs the rewards of step 1")."""
    cfg = write_config(workspace, "cur_engine", mode="grpo", base_model=str(workspace / "tiny"), max_steps=3,
                       world_size=1, per_device_batch_size=8, num_generations=4, max_completion_length=4,
                       learning_rate=1e-3, beta=0.0, generation="engine", curriculum={"enabled": True})
    status, lines = launch(cfg, "grpo")
    assert status == 0, "\n".join(lines[-30:])
    assert any("grpo finished after 3 steps" in line for line in lines), lines[-10:]


def test_killed_grpo_curriculum_run_resumes_with_identical_sampling_rewards_kl_stream_and_weights(workspace):
    """GRPO's losses depend on sampled completions: equal per-step rewards after a resume mean the
    generation RNG, the domain sampler and the data order all came back. With the curriculum on, each
    step's prompts are decided from rewards gathered over both ranks during the run; a run killed
    after its step-3 checkpoint must replay those decisions and go on to draw the same stream (hash
    chain of every slot and weight), weights, rewards, KL and losses."""
    common = dict(mode="grpo", base_model=str(workspace / "tiny"), max_steps=6, save_steps=3, learning_rate=1e-3,
                  per_device_batch_size=8, num_generations=4, max_completion_length=4, temperature=1.0, beta=0.04,
                  curriculum={"enabled": True, "window": 2, "min_multiplier": 0.2})
    status, lines = launch(write_config(workspace, "cur_straight", tracking=True, **common), "grpo")
    assert status == 0, "\n".join(lines[-40:])
    run_id = next(line.split()[3] for line in lines if line.startswith("temper: MLflow run "))
    interrupted = write_config(workspace, "cur_interrupted", **common)
    kill_at_checkpoint_then_resume(interrupted, "grpo", step=3)

    final = {name: json.loads((workspace / name / "checkpoint-6" / "temper_state.json").read_text())["sampler"]
             for name in ("cur_straight", "cur_interrupted")}
    assert final["cur_straight"]["batches"] == 6 and len(final["cur_straight"]["observations"]) == 6
    assert final["cur_interrupted"] == final["cur_straight"]  # same stream digest, counts, estimates, log

    expected, resumed = step_metrics(workspace / "cur_straight"), step_metrics(workspace / "cur_interrupted")
    assert sorted(resumed) == sorted(expected) == list(range(1, 7))
    assert "kl" in expected[1] and any(k.startswith("reward/") for k in expected[1]), sorted(expected[1])
    for step, row in expected.items():
        assert {f"weight/{d}" for d in DOMAINS} <= set(row), sorted(row)
        for key in (k for k in row if k in ("loss", "kl") or k.startswith(("reward/", "weight/"))):
            tolerance = 1e-6 if key.startswith("weight/") else 1e-5
            assert abs(resumed[step].get(key, math.nan) - row[key]) <= tolerance, (step, key, row, resumed[step])

    # Killed after its last checkpoint (before the export): the next attempt resumes from checkpoint-6 and
    # trains no step 7 (the Trainer would, from a final checkpoint with batches left in its epoch).
    status, lines = launch(interrupted, "grpo")
    assert status == 0 and any("resuming from" in line and "checkpoint-6" in line for line in lines), "\n".join(lines[-40:])
    assert not (workspace / "cur_interrupted" / "checkpoint-7").exists()
    assert max(step_metrics(workspace / "cur_interrupted")) == 6

    # the weights over time in MLflow (the embedded store of the workspace's TEMPER_HOME)
    import mlflow

    from infra.tracking.connection import configure

    configure()
    client = mlflow.MlflowClient()
    history = client.get_metric_history(run_id, f"weight_{DOMAINS[0]}")
    assert [(m.step, m.value) for m in history] == [(s, expected[s][f"weight/{DOMAINS[0]}"]) for s in range(1, 7)]
    (workspace / "cur_mlflow").mkdir()
    table = client.download_artifacts(run_id, "curriculum_weights.csv", str(workspace / "cur_mlflow"))
    assert len(Path(table).read_text().splitlines()) == 1 + 6 * len(DOMAINS)
    assert {a.path for a in client.list_artifacts(run_id)} >= {"curriculum_weights.png", "reward_heatmap.png"}
    # steps 1-2 are drawn before any reward is in (the catalog's ratios); later ones were steered
    key = f"weight/{DOMAINS[0]}"
    assert expected[1][key] == expected[2][key]
    assert any(abs(expected[s][key] - expected[1][key]) > 1e-3 for s in range(3, 7)), expected
