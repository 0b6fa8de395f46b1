"""The fast profile's prompt lookup, on the engine's own cache: greedy output equal to the standard profile's on
every catalog domain's prompts (starter, long-context, agentic, public benchmarks), log-probabilities equal
within 1e-4, the cache cut back after rejected drafts, long prompts chunk-prefilled and prefix-cached as in the
standard profile, and the parity gate passes it."""

from functools import lru_cache
from pathlib import Path

import pytest
import torch

from temper.data.catalog import load_domain
from temper.data.generators import generate
from temper.rollout.config import EngineConfig, LaneConfig
from temper.rollout.decoding import SamplingParams
from temper.rollout.engine import Engine
from temper.rollout.parity import parity_gate
from temper.training.tiny import init_tiny

REPO = Path(__file__).resolve().parents[2]
LANES = [LaneConfig(name="short", max_prompt_tokens=4096, prefill_chunk_tokens=128)]
GREEDY = SamplingParams(max_tokens=48, temperature=0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@lru_cache
def catalog_prompts(rows: int = 2, longest: int = 3000) -> dict[str, list[str]]:
    """Each catalog domain's first rows as the prompt its eval renders (the last ``longest`` characters: the tiny
    model's tokenizer is a character's token, its context 4096). Generated once per argument: read, never changed."""
    out = {}
    for path in sorted((REPO / "domains").glob("*.yaml")):
        d = load_domain(path)
        frame = generate(d.dataset.generator, min(d.dataset.rows, 8), d.dataset.seed, d.split.eval_fraction,
                         d.dataset.generator_params).head(rows)
        out[d.name] = [d.render_prompt(rec)[-longest:] for rec in frame.to_dict("records")]
    return out


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    target = init_tiny(tmp_path_factory.mktemp("lookup") / "target", max_positions=4096, seed=3)
    standard = Engine(EngineConfig(model_dir=target, lanes=LANES))
    fast = Engine(EngineConfig(model_dir=target, lanes=LANES, profile="fast"), model=standard.model,
                  tokenizer=standard.tokenizer)
    assert fast.mixed  # verifies ride in the engine's one forward per step (mixed.py)
    return standard, fast


@pytest.fixture(scope="module")
def per_request(engines):
    """The fast profile without mixed batches: each request's verify is a forward of its own."""
    standard, _ = engines
    engine = Engine(EngineConfig(model_dir=standard.config.model_dir, lanes=LANES, profile="fast", mixed_batches=False),
                    model=standard.model, tokenizer=standard.tokenizer)
    assert not engine.mixed
    return engine


def test_greedy_output_equals_the_standard_profile_on_every_catalog_domain(engines):
    standard, fast = engines
    prompts = catalog_prompts()
    assert len(prompts) >= 17 and {"long_retrieval", "long_tool_history", "file_tasks", "humaneval"} <= set(prompts)
    before = dict(fast.decoder.stats)
    for domain, texts in prompts.items():
        want, got = standard.generate(texts, GREEDY), fast.generate(texts, GREEDY)
        for w, g in zip(want, got):
            assert g.error is None and g.samples[0].token_ids == w.samples[0].token_ids, domain
    stats = {k: v - before[k] for k, v in fast.decoder.stats.items()}
    # drafts were proposed and accepted: fewer target forwards than tokens (the random model loops, so it copies)
    assert stats["accepted"] > 0 and stats["steps"] < stats["emitted"], stats


def test_per_request_verify_forwards_give_the_same_output(engines, per_request):
    standard, _ = engines
    prompts = catalog_prompts(rows=1)
    for domain in ("invoice_extraction", "long_tool_history", "python_functions", "file_tasks"):
        want, got = standard.generate(prompts[domain], GREEDY), per_request.generate(prompts[domain], GREEDY)
        assert got[0].samples[0].token_ids == want[0].samples[0].token_ids, domain
    assert per_request.decoder.stats["accepted"] > 0
    assert any(e.kind == "decode" and e.detail.startswith("lookup") for e in per_request.step_log)


def test_logprobs_equal_the_standard_profiles_within_1e_4(engines):
    standard, fast = engines
    params = SamplingParams(max_tokens=40, temperature=0, logprobs=True)
    texts = catalog_prompts(rows=1)["invoice_extraction"]
    (w,), (g,) = standard.generate(texts, params), fast.generate(texts, params)
    assert g.samples[0].token_ids == w.samples[0].token_ids
    assert g.samples[0].logprobs == pytest.approx(w.samples[0].logprobs, abs=1e-4)


def test_the_cache_after_rejected_drafts_holds_exactly_the_sequence(engines):
    """After the run, the finished sample's prompt + completion K/V (cached for the next turn) equal a fresh
    forward over the same tokens: a rejected tail left in the cache would shift every later position."""
    standard, fast = engines
    fast.prefix_cache.clear()
    before = dict(fast.decoder.stats)
    text = catalog_prompts(rows=1)["invoice_extraction"][0]
    (res,) = fast.generate([text], SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
    stats = {k: v - before[k] for k, v in fast.decoder.stats.items()}
    assert stats["proposed"] > stats["accepted"], stats  # some drafts were rejected and cut
    tokens = fast.encode(text) + res.samples[0].token_ids
    hit = fast.prefix_cache.match(tokens)
    assert hit.length == len(tokens) - 1  # everything but the last token, which no forward has seen
    with torch.no_grad():
        fresh = standard.model(input_ids=torch.tensor([tokens[:-1]]), use_cache=True).past_key_values
    for (k, v), layer in zip(hit.kv, fresh.layers):
        assert torch.allclose(k, layer.keys, atol=1e-5) and torch.allclose(v, layer.values, atol=1e-5)


def test_a_long_prompt_is_chunk_prefilled_then_reused_from_the_prefix_cache_with_drafts(engines):
    standard, fast = engines
    fast.prefix_cache.clear()
    text = catalog_prompts(rows=1)["long_retrieval"][0]
    n = len(fast.encode(text))
    assert n > 3 * LANES[0].prefill_chunk_tokens
    first_step = fast.steps
    (a,) = fast.generate([text], GREEDY)
    chunks = [e for e in fast.step_log if e.step > first_step and e.kind == "prefill"]
    assert len(chunks) >= 3 and all(e.tokens <= LANES[0].prefill_chunk_tokens for e in chunks)
    (b,) = fast.generate([text], GREEDY)
    assert b.cached_tokens >= n - 1 and b.samples[0].token_ids == a.samples[0].token_ids
    assert a.samples[0].token_ids == standard.generate([text], GREEDY)[0].samples[0].token_ids


def test_a_sampled_group_decodes_and_the_parity_gate_passes_prompt_lookup(engines):
    standard, fast = engines
    (group,) = fast.generate(["user: 12 * 12 = ?\nassistant: "], SamplingParams(max_tokens=16, n=4, seed=1))
    assert len(group.samples) == 4 and all(len(s.token_ids) > 0 for s in group.samples)
    report = parity_gate(standard, fast, catalog_prompts(rows=1)["long_tool_history"] * 2, max_tokens=24)
    assert report.passed and report.mismatches == [], report.reason


@pytest.mark.parametrize("draft", ["int8", "layers"])
def test_a_draft_models_drafts_give_the_standard_output_on_every_catalog_domain(engines, draft, tmp_path):
    """The draft-model path on the same loop: an int8 copy of the target (agrees on most tokens: drafts are
    accepted) and a one-layer copy (agrees on few: most are rejected and cut back out of both caches)."""
    from temper.rollout.config import SpeculativeConfig
    from temper.rollout.draft_model import derive_layer_draft

    standard, _ = engines
    spec = SpeculativeConfig(method="draft_model", quantize_draft=True) if draft == "int8" else \
        SpeculativeConfig(method="draft_model", draft_dir=derive_layer_draft(standard.config.model_dir, tmp_path, 1))
    fast = Engine(EngineConfig(model_dir=standard.config.model_dir, lanes=LANES, profile="fast", speculative=spec),
                  model=standard.model, tokenizer=standard.tokenizer)
    for domain, texts in catalog_prompts(rows=1).items():
        want, got = standard.generate(texts, GREEDY), fast.generate(texts, GREEDY)
        assert got[0].error is None and got[0].samples[0].token_ids == want[0].samples[0].token_ids, (draft, domain)
    s = fast.decoder.stats
    assert s["accepted"] > 0 and s["proposed"] > s["accepted"], s
    if draft == "int8":
        assert s["steps"] < s["emitted"], s  # fewer target forwards than tokens
