"""Slot decode (``temper/rollout/slots.py``) on a tiny random Llama, run eagerly on CPU: the same static forward
that a GPU engine replays as CUDA graphs. It must give transformers' own greedy tokens, the mixed path's sampled
tokens and log-probabilities, keep the prefix cache's completion entries, give every slot back, and hand requests
that do not fit (too long, no free slot) to the mixed path."""

import pytest
import torch
from transformers import GenerationConfig

from temper.rollout.config import EngineConfig, LaneConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [f"user: what is {i} + {3 * i}? Think, then answer.\nassistant: " for i in range(5)]
LANE = [LaneConfig(name="short", max_prompt_tokens=2048, prefill_chunk_tokens=16)]


@pytest.fixture(scope="module")
def base(tiny_model):
    return Engine(EngineConfig(model_dir=tiny_model(max_positions=2048), lanes=LANE, slot_decode="off"))


def engine(base, **kw):
    return Engine(base.config.model_copy(update=kw), model=base.model, tokenizer=base.tokenizer)


@pytest.mark.parametrize("kv_heads", [None, 2])  # 2 of 4: grouped-query attention, as the 0.7B GPU model has
def test_greedy_tokens_equal_transformers_generate(base, tiny_model, kv_heads):
    if kv_heads:
        base = Engine(EngineConfig(model_dir=tiny_model(max_positions=2048, kv_heads=kv_heads), lanes=LANE,
                                   slot_decode="off"))
    slotted = engine(base, slot_decode="on", decode_slots=8)
    replayed = engine(base, slot_decode="on", decode_slots=8)
    replayed.slot_decoder.graphs = True  # off CUDA: capture = a forward on padding inputs, replay = a rerun
    gc = GenerationConfig(max_new_tokens=40, do_sample=False, pad_token_id=0, eos_token_id=2)
    refs = []
    for p in PROMPTS:
        ids = base.tokenizer(p, return_tensors="pt").input_ids
        with torch.no_grad():
            refs.append(base.model.generate(ids, generation_config=gc)[0, ids.shape[1]:].tolist())
    got = slotted.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0.0))
    assert [r.samples[0].token_ids for r in got] == refs
    stats = slotted.stats()["slot_decode"]
    assert stats["steps"] >= 39 and stats["graphs"] == 0  # eager on CPU: no CUDA graph
    assert stats["free"] == stats["slots"] == 8  # every slot given back
    # the capture/replay order of the GPU path: buckets captured mid-run, every step's inputs still its own
    got = replayed.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0.0))
    assert [r.samples[0].token_ids for r in got] == refs
    assert replayed.stats()["slot_decode"]["graphs"] >= 2


def test_sampled_groups_match_the_mixed_path(base):
    params = SamplingParams(max_tokens=30, temperature=1.0, top_p=0.9, n=4, seed=7, logprobs=True)
    mixed = engine(base).generate(PROMPTS[:3], params)
    slotted_engine = engine(base, slot_decode="on", decode_slots=16)
    slotted = slotted_engine.generate(PROMPTS[:3], params)
    for a, b in zip(mixed, slotted):
        assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
        for sa, sb in zip(a.samples, b.samples):
            assert sa.logprobs == pytest.approx(sb.logprobs, abs=1e-4)
    assert slotted_engine.stats()["slot_decode"]["steps"] > 0
    # finished samples' prompt + completion KV went into the prefix cache from the slots, as on the mixed path
    assert slotted_engine.prefix_cache.cached_sequences()
    again = slotted_engine.generate(PROMPTS[:1], SamplingParams(max_tokens=5, temperature=0.0))
    assert again[0].cached_tokens > 0


def test_what_does_not_fit_decodes_on_the_mixed_path(base):
    # 3 slots for two groups of 2: the second group finds one slot free, so it stays on the mixed path
    tight = engine(base, slot_decode="on", decode_slots=3)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, n=2)
    ref = engine(base).generate(PROMPTS[:2], greedy)
    got = tight.generate(PROMPTS[:2], greedy)
    assert [[s.token_ids for s in r.samples] for r in got] == [[s.token_ids for s in r.samples] for r in ref]
    assert tight.stats()["slot_decode"]["free"] == 3
    # a request longer than a slot (prompt + max_tokens > decode_slot_tokens) decodes on the mixed path too
    short_slots = engine(base, slot_decode="on", decode_slot_tokens=64)
    long_ask = SamplingParams(max_tokens=60, temperature=0.0)
    assert [r.samples[0].token_ids for r in short_slots.generate(PROMPTS[:1], long_ask)] == \
        [r.samples[0].token_ids for r in engine(base).generate(PROMPTS[:1], long_ask)]
    assert short_slots.stats()["slot_decode"]["steps"] == 0
