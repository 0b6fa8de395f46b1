"""On a CUDA machine (skipped elsewhere): the rank's placement, bf16 training that checkpoints and resumes, and the
rollout engine on the GPU (weights, KV and every step's tensors there; decode steps as CUDA graphs) giving
transformers' own greedy tokens in fp32. Run on one GPU by ``benchmarks/gpu.sh`` before ``benchmarks/gpu.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

REPO = Path(__file__).resolve().parents[2]


def test_a_rank_on_a_gpu_machine_is_placed_on_its_gpu_with_nccl_and_bf16(monkeypatch):
    from temper.core.errors import TrainingError
    from temper.training.config import TrainConfig
    from temper.training.device import check_world_size, rank_placement, resolve_world_size

    gpus = torch.cuda.device_count()
    monkeypatch.setenv("LOCAL_RANK", "0")
    p = rank_placement("auto")
    assert (p.device, p.backend, p.precision) == ("cuda:0", "nccl", "bf16")
    assert rank_placement("fp32").precision == "fp32"
    assert resolve_world_size("auto") == gpus
    cfg = TrainConfig(mode="grpo", run_name="x", base_model="b", output_dir="o", grpo={"per_device_batch_size": 4})
    assert cfg.world_size == gpus and cfg.deepspeed == (gpus > 1)
    with pytest.raises(TrainingError, match=rf"world_size is {gpus + 1} but this machine has {gpus} GPU"):
        check_world_size(gpus + 1)
    monkeypatch.setenv("LOCAL_RANK", str(gpus))
    with pytest.raises(TrainingError, match="sees only"):
        rank_placement("auto")


def test_engine_on_the_gpu_gives_generates_own_greedy_tokens_in_fp32_and_decodes_from_cuda_graphs(tiny_model):
    from transformers import GenerationConfig

    from temper.rollout.config import EngineConfig, LaneConfig
    from temper.rollout.decoding import SamplingParams
    from temper.rollout.engine import Engine

    lanes = [LaneConfig(name="short", max_prompt_tokens=2048, prefill_chunk_tokens=64)]
    engine = Engine(EngineConfig(model_dir=tiny_model(max_positions=1024), lanes=lanes))
    assert engine.device.type == "cuda" and next(engine.model.parameters()).is_cuda
    prompts = [f"user: what is {i} * {i + 7}?\nassistant: " for i in range(6)]
    got = engine.generate(prompts, SamplingParams(max_tokens=48, temperature=0.0))
    gc = GenerationConfig(max_new_tokens=48, do_sample=False, pad_token_id=0, eos_token_id=2)
    for prompt, result in zip(prompts, got):
        ids = engine.tokenizer(prompt, return_tensors="pt").input_ids.to(engine.device)
        with torch.no_grad():
            ref = engine.model.generate(ids, generation_config=gc)[0, ids.shape[1]:].tolist()
        assert result.samples[0].token_ids == ref
    stats = engine.stats()
    assert stats["slot_decode"]["graphs"] >= 1 and stats["slot_decode"]["steps"] >= 47
    assert stats["slot_decode"]["free"] == stats["slot_decode"]["slots"]
    assert stats["prefix_cache"]["budget_bytes"] > 256 * 1024 * 1024  # a share of the device's memory
    # sampled groups with log-probabilities, and a bf16 engine
    sampled = engine.generate(prompts[:2], SamplingParams(max_tokens=16, n=4, seed=1, logprobs=True))
    assert all(len(s.logprobs) == len(s.token_ids) > 0 for r in sampled for s in r.samples)
    bf16 = Engine(EngineConfig(model_dir=tiny_model(max_positions=1024), lanes=lanes, dtype="bfloat16"))
    assert all(r.error is None for r in bf16.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0)))


def test_bf16_grpo_on_the_gpu_checkpoints_resumes_and_exports(tiny_model, temper_home, tmp_path):
    from infra.launcher_local import run_job
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.training.config import nest_stage_fields
    from temper.training.job import training_job

    catalog = load_catalog(REPO / "domains")
    for name in ("arithmetic", "multiplication"):
        generate_domain_dataset(catalog[name])
    out = tmp_path / "run"
    fields = {"mode": "grpo", "run_name": "gpu-resume", "base_model": tiny_model(), "domains": ["arithmetic",
              "multiplication"], "output_dir": str(out), "tracking": False, "save_steps": 2, "learning_rate": 1e-3,
              "per_device_batch_size": 8, "num_generations": 4, "max_completion_length": 8, "max_steps": 2,
              "generation": "engine"}
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump(nest_stage_fields(fields)))
    lines: list[str] = []
    assert run_job(training_job(str(config), "grpo"), on_line=lines.append) == 0, "\n".join(lines[-40:])
    assert (out / "checkpoint-2").is_dir()
    assert run_job(training_job(str(config), "grpo", max_steps=4), on_line=lines.append) == 0, "\n".join(lines[-40:])
    assert any("resuming from" in line and "checkpoint-2" in line for line in lines), "\n".join(lines[-40:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == [1, 2, 3, 4]
    assert all(r["mfu"] > 0 and r["train_phase_s"] > 0 and r["rollout_s"] > 0 for r in rows if "loss" in r)
    assert json.loads((out / "model" / "config.json").read_text())["dtype"] in ("bfloat16", "float32")
