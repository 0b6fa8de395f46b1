"""The fast profile (speculative decoding) and its parity gate: an honest draft passes with identical greedy
output and a recorded speed-up; a variant whose output differs (draft tokens served unverified) is blocked,
and registering it never sets the serving alias."""

import pytest

from temper.core.tag_names import PARITY_TAG, TAG_SERVING_PROFILE
from temper.rollout.config import EngineConfig, LaneConfig, SpeculativeConfig
from temper.rollout.draft_model import derive_layer_draft
from temper.rollout.engine import Engine
from temper.rollout.parity import ParityFailed, parity_gate, register_serving_profiles, require_parity
from temper.training.tiny import init_tiny

PROMPTS = [f"user: what is {i} * {i + 2}?\nassistant: " for i in range(4)]
LANES = [LaneConfig(name="short", max_prompt_tokens=512)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast")
    target = init_tiny(root / "target", hidden=64, layers=2, seed=3)
    return target, derive_layer_draft(target, root / "draft", keep_layers=1)


@pytest.fixture(scope="module")
def standard(models):
    return Engine(EngineConfig(model_dir=models[0], lanes=LANES))


def fast_engine(standard, draft_dir, verify=True):
    cfg = standard.config.model_copy(update={"profile": "fast", "speculative": SpeculativeConfig(
        method="draft_model", draft_dir=draft_dir, num_assistant_tokens=4, verify=verify)})
    return Engine(cfg, model=standard.model, tokenizer=standard.tokenizer)


def test_derived_draft_is_the_target_with_fewer_layers(models, standard):
    fast = fast_engine(standard, models[1])
    draft = fast.decoder.draft
    assert draft.config.num_hidden_layers == 1
    assert (draft.model.embed_tokens.weight == standard.model.model.embed_tokens.weight).all()


def test_parity_gate_passes_the_honest_draft_and_records_the_speedup(models, standard):
    report = parity_gate(standard, fast_engine(standard, models[1]), PROMPTS, max_tokens=16)
    assert report.passed, report.reason
    assert report.mismatches == [] and report.tokens == 16 * len(PROMPTS)
    assert report.speedup > 0 and report.standard_s > 0 and report.fast_s > 0
    assert require_parity(report) is report


def test_parity_gate_blocks_a_variant_that_diverges(models, standard):
    report = parity_gate(standard, fast_engine(standard, models[1], verify=False), PROMPTS, max_tokens=16)
    assert not report.passed and report.mismatches
    assert "diverge" in report.reason
    with pytest.raises(ParityFailed):
        require_parity(report)


def test_the_draft_model_runs_on_the_engines_loop_with_the_standard_outputs_and_logprobs(models, standard):
    """Drafts from the draft model, verified on the engine's cache: the prompt is prefilled once by the engine (the
    prefix cache sees it), the draft's forwards are counted, greedy tokens and log-probabilities are standard's."""
    from temper.rollout.decoding import SamplingParams

    params = SamplingParams(max_tokens=16, temperature=0, logprobs=True)
    want = standard.generate(PROMPTS, params)
    fast = fast_engine(standard, models[1])
    got = fast.generate(PROMPTS, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    for g, w in zip(got, want):
        assert max(abs(a - b) for a, b in zip(g.samples[0].logprobs, w.samples[0].logprobs)) < 1e-4
    s = fast.decoder.stats
    assert s["proposed"] > 0 and s["draft_forwards"] > 0, s
    assert s["emitted"] == sum(len(r.token_ids[0]) - 1 for r in got), s  # the first token of each is the prefill's
    assert fast.stats()["prompt_reuse"]["prompt_tokens"] == sum(len(standard.encode(p)) for p in PROMPTS)


def test_both_profiles_are_registered_and_a_blocked_fast_one_gets_no_serving_alias(models, standard, temper_home):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from infra.tracking.connection import configure

    configure()
    ok = parity_gate(standard, fast_engine(standard, models[1]), PROMPTS[:2], max_tokens=8)
    out = register_serving_profiles("policy", str(models[0]), ok, draft=str(models[1]))
    client = MlflowClient()
    std = client.get_model_version_by_alias("policy", "serving-standard")
    fast = client.get_model_version_by_alias("policy", "serving-fast")
    assert std.tags[TAG_SERVING_PROFILE] == "standard" and fast.tags[TAG_SERVING_PROFILE] == "fast"
    parity = {field: PARITY_TAG.format(field=field) for field in ("passed", "speedup", "mismatches")}
    assert fast.tags[parity["passed"]] == "true" and float(fast.tags[parity["speedup"]]) > 0
    assert out["fast"]["version"] == fast.version

    bad = parity_gate(standard, fast_engine(standard, models[1], verify=False), PROMPTS[:2], max_tokens=8)
    with pytest.raises(ParityFailed, match="not served"):
        register_serving_profiles("policy", str(models[0]), bad, draft=str(models[1]))
    still = client.get_model_version_by_alias("policy", "serving-fast")
    assert still.version == fast.version  # the serving alias did not move to the diverging variant
    blocked = client.get_model_version_by_alias("policy", "serving-fast-blocked")
    assert blocked.tags[parity["passed"]] == "false" and int(blocked.tags[parity["mismatches"]]) > 0
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("policy", "serving-nonexistent")


def test_the_fast_profile_serves_the_same_api(models, standard):
    import openai

    from temper.rollout.decoding import SamplingParams
    from temper.rollout.server import EmbeddedServer

    want = standard.generate(PROMPTS[:1], SamplingParams(max_tokens=12, temperature=0))[0].texts[0]
    with EmbeddedServer(fast_engine(standard, models[1])) as url, \
            openai.OpenAI(base_url=url, api_key="x", max_retries=0) as client:
        r = client.completions.create(model="temper", prompt=PROMPTS[0], max_tokens=12, temperature=0)
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="temper", prompt=PROMPTS[0], max_tokens=12, temperature=0, stream=True))
    assert r.choices[0].text == want == streamed
