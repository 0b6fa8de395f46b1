"""Pure parts of training: config validation, generated DeepSpeed config, the domain sampler."""

from __future__ import annotations

import collections

import pytest

from temper.training.config import TrainConfig, nest_stage_fields
from temper.training.deepspeed import accelerate_config, deepspeed_config
from temper.training.mixing import DomainMixSampler


def _cfg(**kw):
    base = dict(mode="grpo", run_name="r", base_model="/m", output_dir="/o", per_device_batch_size=4,
                num_generations=4, world_size=2)
    fields = {**base, **kw}
    if fields["mode"] == "sft":
        fields.pop("num_generations")
    return TrainConfig.model_validate(nest_stage_fields(fields))


def test_grpo_batch_must_divide_into_groups():
    with pytest.raises(ValueError, match=r"divisible by grpo.num_generations \(4\)"):
        _cfg(per_device_batch_size=3)


def test_deepspeed_config_shards_tiny_models_and_uses_torch_adamw():
    ds = deepspeed_config(_cfg())
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["stage3_param_persistence_threshold"] == 0
    assert "optimizer" not in ds  # the Trainer passes torch AdamW
    acc = accelerate_config(_cfg(), "/x/ds.json")
    assert acc["num_processes"] == 2 and acc["distributed_type"] == "DEEPSPEED"


def test_sampler_follows_ratios_and_resumes_exactly():
    s = DomainMixSampler(sizes={"a": 50, "b": 30}, ratios={"a": 3.0, "b": 1.0}, seed=7)
    first = s.take(400)
    counts = collections.Counter(name for name, _ in first)
    assert counts == {"a": 300, "b": 100}  # stratified: exactly the ratios at a multiple of their sum
    state = s.state_dict()
    rest = s.take(100)
    resumed = DomainMixSampler(sizes={"a": 50, "b": 30}, ratios={"a": 3.0, "b": 1.0}, seed=7)
    resumed.load_state_dict(state)
    assert resumed.take(100) == rest


def test_sampler_is_stratified_over_300_domains_at_every_prefix():
    """Each domain's realised count stays within 1 of n x its weight for every prefix n (not just on
    average), with unequal weights; equal-weight ties are broken by the seed, not by name."""
    import random

    rng = random.Random(5)
    ratios = {f"d{i:03d}": rng.choice([0.5, 1.0, 1.0, 2.0, 3.0]) for i in range(300)}
    sizes = {name: rng.randint(5, 40) for name in ratios}
    total = sum(ratios.values())
    s = DomainMixSampler(sizes=sizes, ratios=ratios, seed=11)
    counts = collections.Counter()
    worst = 0.0
    for n in range(1, 1501):
        name, idx = s.next()
        assert 0 <= idx < sizes[name]
        counts[name] += 1
        worst = max(worst, max(abs(counts[d] - n * r / total) for d, r in ratios.items()))
    assert worst < 1.0, worst
    assert dict(counts) == s.counts()
    equal = DomainMixSampler(sizes={n: 5 for n in ratios}, ratios=dict.fromkeys(ratios, 1.0), seed=0)
    other_seed = DomainMixSampler(sizes={n: 5 for n in ratios}, ratios=dict.fromkeys(ratios, 1.0), seed=1)
    first, first_other = [d for d, _ in equal.take(20)], [d for d, _ in other_seed.take(20)]
    assert len(set(first)) == 20 and first != sorted(first) and first != first_other


def test_sampler_visits_every_record_once_per_domain_epoch():
    s = DomainMixSampler(sizes={"a": 10}, ratios={"a": 1.0}, seed=0)
    assert sorted(i for _, i in s.take(10)) == list(range(10))


def test_sampler_refuses_state_of_other_data():
    s = DomainMixSampler(sizes={"a": 10}, ratios={"a": 1.0}, seed=0)
    other = DomainMixSampler(sizes={"a": 11}, ratios={"a": 1.0}, seed=0)
    with pytest.raises(ValueError, match="sizes"):
        other.load_state_dict(s.state_dict())


def test_sampler_resumed_exactly_at_an_epoch_boundary_neither_skips_nor_repeats():
    """Stop right after the last record of a domain epoch: the resumed sampler starts the next epoch."""
    s = DomainMixSampler(sizes={"a": 6}, ratios={"a": 1.0}, seed=3)
    first_epoch = s.take(6)
    state = s.state_dict()
    uninterrupted = s.take(6)
    resumed = DomainMixSampler(sizes={"a": 6}, ratios={"a": 1.0}, seed=3)
    resumed.load_state_dict(state)
    second_epoch = resumed.take(6)
    assert second_epoch == uninterrupted
    assert sorted(i for _, i in first_epoch) == sorted(i for _, i in second_epoch) == list(range(6))
    assert first_epoch != second_epoch  # reshuffled per epoch, not replayed


def test_resume_refuses_a_changed_training_config_but_allows_more_steps(tmp_path):
    from temper.training import checkpoint as ckpt
    from temper.training.config import TrainingError

    cfg = _cfg(mode="sft", learning_rate=1e-3)
    ckpt.write_state(tmp_path, cfg, {}, {"a": "d1"}, step=3)
    assert ckpt.check_resume(_cfg(mode="sft", learning_rate=1e-3, max_steps=500, save_steps=7, timeout_s=60),
                             tmp_path, {"a": "d1"})["step"] == 3
    with pytest.raises(TrainingError, match="training config changed"):
        ckpt.check_resume(_cfg(mode="sft", learning_rate=2e-3), tmp_path, {"a": "d1"})
    with pytest.raises(TrainingError, match="training config changed"):
        ckpt.check_resume(_cfg(mode="sft", learning_rate=1e-3, warmup_steps=2), tmp_path, {"a": "d1"})
    with pytest.raises(TrainingError, match=r"dataset changed .*a: d1 -> d2"):
        ckpt.check_resume(cfg, tmp_path, {"a": "d2"})


def test_training_refuses_a_dataset_that_changed_after_validation(temper_home, tmp_path):
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.datasets import load_dataset, write_dataset_bytes
    from temper.data.generators import generate_domain_dataset
    from temper.training.config import TrainConfig, TrainingError
    from temper.training.run import load_domains

    domain = load_catalog(get_settings().catalog_dir)["arithmetic"]
    generate_domain_dataset(domain)
    validated = load_dataset(domain).digest
    cfg = dict(mode="sft", run_name="r", base_model="m", domains=["arithmetic"], output_dir=str(tmp_path))
    assert load_domains(TrainConfig(**cfg, expected_digests={"arithmetic": validated}), get_settings())[2] == {
        "arithmetic": validated}
    # the file is rewritten between the contract check and the training job: one more (poisoned) row
    poisoned = load_dataset(domain).frame.iloc[:1].assign(answer="rm -rf /")
    write_dataset_bytes(domain, open(load_dataset(domain).uri, "rb").read()
                        + poisoned.to_json(orient="records", lines=True).encode())
    with pytest.raises(TrainingError, match=rf"dataset .*arithmetic.jsonl of domain arithmetic changed after it was "
                                            rf"validated \(validated sha256 {validated[:16]}\.\.\., now [0-9a-f]{{16}}"):
        load_domains(TrainConfig(**cfg, expected_digests={"arithmetic": validated}), get_settings())
    with pytest.raises(TrainingError, match="domain multiplication was validated but is not among the domains"):
        load_domains(TrainConfig(**cfg, expected_digests={"multiplication": validated}), get_settings())


def test_local_ranks_share_out_the_cores_on_a_machine_without_gpus(monkeypatch):
    """One rank used to get OMP_NUM_THREADS=1 like each of two, leaving a core idle: the real model's one-rank run
    trained at half speed on 2 cores."""
    from temper.training import deepspeed as ds

    monkeypatch.setattr(ds, "visible_gpus", lambda: 0)
    monkeypatch.setattr(ds.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert ds.launch_env(1)["OMP_NUM_THREADS"] == "8"
    assert ds.launch_env(2)["OMP_NUM_THREADS"] == "4"
    assert ds.launch_env(16)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setattr(ds, "visible_gpus", lambda: 2)  # GPU ranks set their own threads (configure_rank)
    assert "OMP_NUM_THREADS" not in ds.launch_env(2)


def test_a_missing_realistic_model_package_is_one_clear_error(monkeypatch):
    """`base_model: smollm2` without `make realistic`: a TemperError naming the fix, not SystemExit in a task."""
    import importlib.util

    from temper.core.errors import TemperError
    from temper.training import gguf_base

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TemperError, match="make realistic"):
        gguf_base.packaged_gguf()


def test_a_rank_builds_deepspeeds_op_with_its_interpreters_ninja(monkeypatch):
    """Was: ranks started without the venv on PATH built with the system's ninja 1.11, pods with the venv's 1.13;
    each read the other's build log as too old and recompiled the comm op (~100 s of CPU) on every switch."""
    import os
    import shutil
    import sys
    from pathlib import Path

    from temper.training.device import use_interpreters_ninja

    venv_ninja = Path(sys.executable).parent / "ninja"
    assert venv_ninja.exists(), "deepspeed's ninja dependency is installed beside the interpreter"
    monkeypatch.setenv("PATH", f"/usr/bin:/bin:{venv_ninja.parent}")
    use_interpreters_ninja()
    use_interpreters_ninja()
    assert shutil.which("ninja") == str(venv_ninja)
    assert os.environ["PATH"] == f"{venv_ninja.parent}:/usr/bin:/bin"  # moved to the front, once


def test_the_jit_cache_is_one_per_environment(monkeypatch):
    """Two checkouts' venvs in one folder rebuilt the op at every switch (its build commands name the venv's paths)."""
    import sys
    from pathlib import Path

    from temper.training import deepspeed as ds

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    here = ds.torch_extensions_dir()
    monkeypatch.setattr(sys, "prefix", "/elsewhere/.venv")
    other = ds.torch_extensions_dir()
    assert here != other and Path(here).parent == Path(other).parent
    assert ds.launch_env(1)["TORCH_EXTENSIONS_DIR"] == other
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/cache/volume")  # a pod's shared cache volume is taken as given
    assert ds.torch_extensions_dir() == "/cache/volume"


def test_a_rank_copies_the_images_compiled_ops_into_its_cache_with_their_times(monkeypatch, tmp_path):
    """Was: every CPU rank pod compiled DeepSpeed's comm op into its own /tmp at start. The image's copy must arrive
    whole, with its files' times (ninja's log records them: changed times would rebuild it), without a build lock."""
    import os

    from temper.training import deepspeed as ds

    prebuilt, cache = tmp_path / "image", tmp_path / "pod-tmp"
    op = prebuilt / "deepspeed_shm_comm"
    op.mkdir(parents=True)
    for name in ("deepspeed_shm_comm.so", ".ninja_log", "build.ninja", "lock"):
        (op / name).write_text(name)
        os.utime(op / name, (1_700_000_000, 1_700_000_000))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))
    monkeypatch.delenv(ds.PREBUILT_EXTENSIONS_ENV, raising=False)
    assert ds.seed_torch_extensions() == [] and not cache.exists()  # not in an image: nothing to copy
    monkeypatch.setenv(ds.PREBUILT_EXTENSIONS_ENV, str(prebuilt))
    assert ds.seed_torch_extensions() == ["deepspeed_shm_comm"]
    copied = cache / "deepspeed_shm_comm"
    assert sorted(p.name for p in copied.iterdir()) == [".ninja_log", "build.ninja", "deepspeed_shm_comm.so"]
    assert all(p.stat().st_mtime == 1_700_000_000 for p in copied.iterdir())
    assert [p.name for p in cache.iterdir()] == ["deepspeed_shm_comm"]  # no temporary folder left
    (copied / "build.ninja").write_text("this pod's own")
    assert ds.seed_torch_extensions() == []  # an op already in the cache is left as it is
    assert (copied / "build.ninja").read_text() == "this pod's own"
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "a-file" / "cache"))
    assert ds.seed_torch_extensions() == []  # a cache it cannot write: DeepSpeed compiles the op, the rank goes on
