"""The embedded engine on a tiny random Llama: greedy tokens equal transformers' own greedy generate with
and without the prefix cache, under eviction, for GRPO groups and across turns; lanes keep a long prefill
from starving short requests (checked on the scheduler's step log, not on timings); a mixed forward equals
the model's own forward per request."""

import pytest
import torch
from transformers import GenerationConfig

from temper.rollout.config import EngineConfig, LaneConfig, PrefixCacheConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine

SYSTEM = "system: you are a careful assistant. Answer with one number and nothing else.\n"
PROMPTS = [SYSTEM + f"user: what is {i} + {3 * i}?\nassistant: " for i in range(6)]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
ONE_LANE = [LaneConfig(name="short", max_prompt_tokens=2048, prefill_chunk_tokens=16)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def base(tiny_model):
    return Engine(EngineConfig(model_dir=tiny_model(max_positions=2048), lanes=ONE_LANE))


def engine(base, **kw):
    """Another engine over the same weights (no reload)."""
    cfg = base.config.model_copy(update=kw)
    return Engine(cfg, model=base.model, tokenizer=base.tokenizer)


def reference(base, prompt, max_tokens):
    ids = base.tokenizer(prompt, return_tensors="pt").input_ids
    gc = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, pad_token_id=0, eos_token_id=2)
    with torch.no_grad():
        return base.model.generate(ids, generation_config=gc)[0, ids.shape[1]:].tolist()


def test_cached_and_uncached_greedy_tokens_match_transformers_generate(base):
    refs = [reference(base, p, GREEDY.max_tokens) for p in PROMPTS]
    uncached = engine(base, prefix_cache=PrefixCacheConfig(enabled=False)).generate(PROMPTS, GREEDY)
    cached_engine = engine(base)
    first = cached_engine.generate(PROMPTS, GREEDY)
    again = cached_engine.generate(PROMPTS, GREEDY)
    assert [r.token_ids[0] for r in uncached] == refs
    assert [r.token_ids[0] for r in first] == refs
    assert [r.token_ids[0] for r in again] == refs
    assert all(r.cached_tokens == 0 for r in uncached)
    assert all(r.cached_tokens >= len(base.encode(SYSTEM)) for r in first[1:])  # the shared system prompt
    assert all(r.cached_tokens == r.prompt_tokens - 1 for r in again)  # whole prompt but the last token


def test_eviction_under_a_small_budget_stays_correct(base):
    refs = [reference(base, p, 12) for p in PROMPTS]
    per_token = 2 * 2 * 4 * 16 * 4  # layers * (K,V) * heads * head_dim * float32
    small = engine(base, prefix_cache=PrefixCacheConfig(budget_bytes=per_token * 120))  # ~1.5 prompts
    params = SamplingParams(max_tokens=12, temperature=0.0)
    for _ in range(2):
        out = small.generate(PROMPTS[::-1] + PROMPTS, params)
        assert [r.token_ids[0] for r in out] == refs[::-1] + refs
    stats = small.prefix_cache.stats()
    assert stats["evictions"] > 0 and stats["hits"] > 0
    assert 0 < stats["bytes"] <= stats["budget_bytes"]


def test_a_grpo_group_is_one_prefill_and_matches_single_samples(base):
    e = engine(base, prefix_cache=PrefixCacheConfig(enabled=False))
    group = e.generate(PROMPTS[:1], GREEDY.model_copy(update={"n": 4}))[0]
    assert group.token_ids == [reference(base, PROMPTS[0], GREEDY.max_tokens)] * 4
    prefilled = e.counters["prefill_tokens"]
    assert prefilled == len(base.encode(PROMPTS[0]))  # the prompt was encoded once for 4 samples
    sampled = SamplingParams(max_tokens=16, temperature=1.0, n=8, seed=7)
    a, b = e.generate(PROMPTS[:1], sampled)[0], e.generate(PROMPTS[:1], sampled)[0]
    assert a.token_ids == b.token_ids  # seeded
    assert len(set(map(tuple, a.token_ids))) > 1  # and the samples differ from each other


def test_the_next_turn_of_an_episode_re_encodes_no_history(base):
    e = engine(base)
    turn1 = PROMPTS[0]
    r1 = e.generate([turn1], GREEDY)[0]
    history = e.encode(turn1) + r1.token_ids[0]
    # Token-level continuation (the random model emits special tokens that a text round trip would drop).
    turn2 = history + e.encode("\nuser: and times two?\nassistant: ")
    before = e.counters["prefill_tokens"]
    r2 = e.generate([turn2], GREEDY)[0]
    # Everything up to the last sampled token had KV; only that token and the new message are encoded.
    assert r1.samples[0].finish_reason == "length"
    assert r2.cached_tokens == len(history) - 1
    assert e.counters["prefill_tokens"] - before == len(turn2) - (len(history) - 1)
    ids = torch.tensor([turn2])
    gc = GenerationConfig(max_new_tokens=GREEDY.max_tokens, do_sample=False, pad_token_id=0, eos_token_id=2)
    with torch.no_grad():
        assert r2.token_ids[0] == base.model.generate(ids, generation_config=gc)[0, len(turn2):].tolist()


def test_stop_strings_and_finish_reasons(base):
    e = engine(base)
    free = e.generate(PROMPTS[:1], GREEDY)[0].texts[0]
    stop = free[5:7]
    cut = e.generate(PROMPTS[:1], GREEDY.model_copy(update={"stop": [stop]}))[0]
    assert cut.texts[0] == free[:free.index(stop)] and cut.samples[0].finish_reason == "stop"
    short = e.generate(PROMPTS[:1], GREEDY.model_copy(update={"max_tokens": 3}))[0]
    assert len(short.token_ids[0]) == 3 and short.samples[0].finish_reason == "length"


def _finish_steps(e):
    return {ev.request_id: ev.step for ev in e.step_log if ev.kind == "finish"}


def _last_prefill_step(e, rid):
    return max(ev.step for ev in e.step_log if ev.kind == "prefill" and ev.request_id == rid)


def _long_then_short(e, tiny_prompt_len=1600):
    long_prompt = [5 + (i % 90) for i in range(tiny_prompt_len)]
    done = []
    sink = done.append
    (long_req,) = e.submit([long_prompt], SamplingParams(max_tokens=4, temperature=0.0), [sink])
    e.step()  # the long request is already prefilling when the short ones arrive
    shorts = e.submit([e.encode(p) for p in PROMPTS[:3]], SamplingParams(max_tokens=8, temperature=0.0),
                      [sink] * 3)
    e.run_until_idle()
    return long_req, shorts


def test_a_long_prefill_in_its_lane_does_not_starve_short_requests(base):
    lanes = [LaneConfig(name="short", max_prompt_tokens=256, prefill_chunk_tokens=256),
             LaneConfig(name="long", max_prompt_tokens=2000, prefill_chunk_tokens=32, time_share=0.2)]
    e = engine(base, lanes=lanes, prefix_cache=PrefixCacheConfig(enabled=False))
    long_req, shorts = _long_then_short(e)
    finish = _finish_steps(e)
    long_prefill_done = _last_prefill_step(e, long_req.id)
    assert {r.lane for r in shorts} == {"short"} and long_req.lane == "long"
    assert all(finish[r.id] < long_prefill_done for r in shorts), (finish, long_prefill_done)
    assert all(r.samples[0].finished for r in [long_req, *shorts])


def test_control_without_lanes_the_short_requests_wait_for_the_long_prefill(base):
    """The same workload through one unchunked FIFO lane: the ordering test above would fail here."""
    lanes = [LaneConfig(name="fifo", max_prompt_tokens=2000, prefill_chunk_tokens=2000, max_running=1)]
    e = engine(base, lanes=lanes, prefix_cache=PrefixCacheConfig(enabled=False))
    long_req, shorts = _long_then_short(e)
    finish = _finish_steps(e)
    assert all(finish[r.id] > _last_prefill_step(e, long_req.id) for r in shorts)


def test_sampled_logprobs_are_under_the_tempered_distribution(base):
    params = SamplingParams(max_tokens=6, temperature=0.5, n=2, seed=11, logprobs=True)
    r = engine(base).generate(PROMPTS[:1], params)[0]
    prompt = base.encode(PROMPTS[0])
    for s in r.samples:
        assert len(s.logprobs) == len(s.token_ids)
        with torch.no_grad():
            logits = base.model(torch.tensor([prompt + s.token_ids])).logits[0, len(prompt) - 1:-1] / 0.5
        want = logits.log_softmax(-1).gather(-1, torch.tensor(s.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(s.logprobs), want, atol=1e-4)


def test_a_mixed_forward_equals_the_models_own_forward_per_request(base):
    """Two requests' prefill chunks in one forward, then a decode row of one beside the other's next chunk,
    then a 3-row group beside a chunk that needs no logits: each request's logits equal ``model(...)`` on
    its own full sequence."""
    from temper.rollout.kv_cache import cache_from
    from temper.rollout.mixed import Segment, mixed_forward

    m = base.model
    a, b = [5 + i % 50 for i in range(40)], [7 + i % 30 for i in range(25)]
    with torch.no_grad():
        ra, rb = m(torch.tensor([a])).logits[0], m(torch.tensor([b])).logits[0]
    ca, cb = cache_from(None, m.config, 64), cache_from(None, m.config, 64)
    out = mixed_forward(m, [Segment(ca, [a[:30]], 0), Segment(cb, [b[:10]], 0)])
    assert torch.allclose(out[0][0], ra[29], atol=1e-5) and torch.allclose(out[1][0], rb[9], atol=1e-5)
    out = mixed_forward(m, [Segment(ca, [[a[30]]], 30), Segment(cb, [b[10:25]], 10)])
    assert torch.allclose(out[0][0], ra[30], atol=1e-5) and torch.allclose(out[1][0], rb[24], atol=1e-5)
    ca.batch_repeat_interleave(3)
    out = mixed_forward(m, [Segment(ca, [[a[31]]] * 3, 31), Segment(cb, [[3]], 25, want_logits=False)])
    assert out[1] is None and torch.allclose(out[0], ra[31].expand(3, -1), atol=1e-5)


def test_mixed_batches_and_per_request_forwards_give_the_same_tokens(base):
    """All six prompts at once (decoded side by side in one forward per step) vs one forward per request."""
    mixed = engine(base, prefix_cache=PrefixCacheConfig(enabled=False))
    single = engine(base, prefix_cache=PrefixCacheConfig(enabled=False), mixed_batches=False)
    assert mixed.mixed and not single.mixed
    got = mixed.generate(PROMPTS, GREEDY)
    assert [r.token_ids for r in got] == [r.token_ids for r in single.generate(PROMPTS, GREEDY)]
    single_forwards = sum(ev.kind in ("prefill", "decode") for ev in single.step_log)  # one per request per step
    assert mixed.counters["forwards"] * 2 < single_forwards, (mixed.counters["forwards"], single_forwards)
