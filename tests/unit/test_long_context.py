"""Long-context eval data (length-exact, deterministic, answerable only by reading) and the effective
context length computed from known accuracy curves."""

import hashlib
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from temper.data.catalog import load_catalog
from temper.data.generators_long_context import FAMILIES, long_context_frame, token_counter
from temper.registry.effective_context import effective_context, effective_tokens, lost_context
from temper.verifiers import get_verifier

REPO = Path(__file__).resolve().parents[2]
COUNT = token_counter("tiny")


@pytest.fixture(scope="module", params=FAMILIES)
def frame(request):
    return long_context_frame(10, 0, COUNT, family=request.param, lengths=[448, 1024, 4096], depths=[0.1, 0.5, 0.9])


def test_prompts_are_within_one_percent_of_their_length_after_re_encoding(frame):
    for prompt, target, tokens in zip(frame.prompt, frame.target_tokens, frame.context_tokens):
        assert COUNT(prompt) == tokens
        assert abs(tokens - target) <= 0.01 * target, (target, tokens)


def test_the_answer_is_stated_once_and_only_in_the_context(frame):
    for prompt, question, answer in zip(frame.prompt, frame.prompt.str.rsplit("Question:", n=1).str[1], frame.answer):
        assert prompt.count(answer) == 1
        assert answer not in question  # the question gives nothing away


def test_the_needed_fact_sits_at_its_depth_when_there_is_room():
    f = long_context_frame(6, 0, COUNT, family="retrieval", lengths=[4096], depths=[0.1, 0.5, 0.9])
    for target, depth, prompt, answer in zip(f.target_depth, f.depth, f.prompt, f.answer):
        assert abs(depth - target) < 0.05, (target, depth)
        assert abs(prompt.index(answer) / len(prompt) - depth) < 0.02


@pytest.mark.slow  # two interpreters that import transformers
def test_the_same_seed_gives_the_same_bytes_whatever_the_hash_seed():
    code = ("import hashlib;from temper.data.generators_long_context import *;"
            "f=long_context_frame(6,3,token_counter('tiny'),family='cross_file',lengths=[448,2048]);"
            "print(hashlib.sha256(f.to_json(orient='records').encode()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                              env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout
               for seed in ("0", "12345")}
    assert len(digests) == 1
    here = long_context_frame(6, 3, COUNT, family="cross_file", lengths=[448, 2048])
    assert hashlib.sha256(here.to_json(orient="records").encode()).hexdigest() == digests.pop().strip()


@pytest.mark.parametrize("name", ["long_retrieval", "long_cross_file", "long_tool_history"])
def test_the_answer_span_scores_1_and_an_answer_from_a_wrong_depth_scores_0(name):
    domain = load_catalog(REPO / "domains")[name]
    f = long_context_frame(5, 0, COUNT, family=domain.dataset.generator_params["family"], lengths=[1024])
    verifier = get_verifier(domain.verifier.family, domain.verifier.params)
    rng = random.Random(0)
    for record in f.to_dict(orient="records"):
        prompt = domain.render_prompt(record)
        assert verifier.score(record, f" {record['answer']}\nmore text").reward == 1.0
        # every other code-like value of the context: the distractors, stated at other depths
        others = set(re.findall(r"ZX-\d{6}|(?<![\d-])\d{6}(?!\d)", prompt)) - {record["answer"]}
        assert others, "the context has no distractor to answer from"
        assert verifier.score(record, rng.choice(sorted(others))).reward == 0.0
        assert verifier.score(record, prompt).reward == 0.0  # the prompt echoed


def test_bad_generator_input_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown long-context family 'needle'"):
        long_context_frame(2, 0, COUNT, family="needle")
    with pytest.raises(ValueError, match="lengths must be token counts of at least 64"):
        long_context_frame(2, 0, COUNT, lengths=[10])
    with pytest.raises(ValueError, match=r"depths must be fractions in \[0, 1\]"):
        long_context_frame(2, 0, COUNT, depths=[1.5])
    with pytest.raises(ValueError, match="the facts and the question alone need more than 100 tokens"):
        long_context_frame(2, 0, COUNT, family="tool_history", lengths=[100])


def _curve(accuracies: dict[int, float], n: int = 40) -> list[tuple[int, float]]:
    """Exactly round(acc * n) correct items per length: a known curve, no sampling noise in the point."""
    return [(length, float(i < round(acc * n))) for length, acc in accuracies.items() for i in range(n)]


def test_effective_length_on_known_curves():
    assert effective_tokens([1, 2, 4, 8], [0.9, 0.85, 0.5, 0.8]) == 2  # 4 drops below 0.72: 8 does not count
    assert effective_tokens([1, 2, 4, 8], [0.9, 0.9, 0.9, 0.9]) == 8
    assert effective_tokens([1, 2], [0.1, 0.1]) is None
    flat = effective_context(_curve({448: 0.9, 1024: 0.9, 2048: 0.875, 4096: 0.9}))
    assert flat.effective_tokens == 4096 and flat.interval[1] == 4096
    cliff = effective_context(_curve({448: 0.9, 1024: 0.9, 2048: 0.1, 4096: 0.05}))
    assert cliff.effective_tokens == 1024 and cliff.interval == (1024, 1024)  # a cliff is certain
    assert cliff.accuracy == [0.9, 0.9, 0.1, 0.05] and all(lo <= a <= hi for lo, a, hi in
                                                           zip(cliff.ci_low, cliff.accuracy, cliff.ci_high))


def test_below_the_short_context_floor_the_length_is_not_measurable():
    tiny = effective_context(_curve({448: 0.05, 1024: 0.0, 2048: 0.0}))
    assert not tiny.measurable and tiny.effective_tokens is None
    assert tiny.describe() == "not measurable (short-context accuracy 0.05 at 448 tokens is below 0.2)"


def test_losing_context_is_judged_on_the_intervals():
    long_ = effective_context(_curve({448: 0.9, 1024: 0.9, 2048: 0.9, 4096: 0.9}))
    short = effective_context(_curve({448: 0.9, 1024: 0.9, 2048: 0.1, 4096: 0.05}))
    same = effective_context(_curve({448: 0.9, 1024: 0.9, 2048: 0.9, 4096: 0.9}), seed=1)
    assert lost_context(short, long_) and not lost_context(long_, short)
    assert not lost_context(same, long_)  # two identical models: no loss
    unmeasured = effective_context(_curve({448: 0.0, 1024: 0.0}))
    assert not lost_context(unmeasured, long_) and not lost_context(short, unmeasured)


def test_the_gate_blocks_a_candidate_that_lost_effective_context_and_not_an_identical_one():
    from temper.registry.gate import PromotionPolicy, decide

    long_ = _curve({448: 0.9, 1024: 0.9, 2048: 0.9, 4096: 0.9})
    short = _curve({448: 0.9, 1024: 0.9, 2048: 0.1, 4096: 0.05})
    means = {"long_retrieval": 0.9, "arithmetic": 0.5}
    better = {"long_retrieval": 0.9, "arithmetic": 0.7}
    lost = decide(better, means, PromotionPolicy(), candidate_curves={"long_retrieval": short},
                  champion_curves={"long_retrieval": long_})
    assert not lost.passed and lost.lost_context == ["long_retrieval"]
    assert lost.reason == ("long_retrieval lost effective context: 1024 tokens (95% CI [1024, 1024]) "
                           "vs champion 4096 tokens (95% CI [4096, 4096])")
    same = decide(better, means, PromotionPolicy(), candidate_curves={"long_retrieval": long_},
                  champion_curves={"long_retrieval": long_})
    assert same.passed and not same.lost_context and "long_retrieval" in same.context


def test_compare_shows_effective_context_next_to_the_domains():
    from temper.registry.compare import compare_metrics, format_comparison

    metrics = {"long_retrieval": {"mean_reward": 0.9, "pass_rate": 0.9, "n": 160}}
    curve = _curve({448: 0.9, 1024: 0.9, 2048: 0.9, 4096: 0.9})
    cmp = compare_metrics("m", "1", "2", metrics, metrics, {}, {}, curves_a={"long_retrieval": curve},
                          curves_b={"long_retrieval": curve})
    text = format_comparison(cmp)
    assert ("long_retrieval: v1 4096 tokens (95% CI [4096, 4096]) -> v2 4096 tokens (95% CI [4096, 4096]): "
            "no significant difference") in text
    tiny = _curve({448: 0.0, 1024: 0.0})
    cmp = compare_metrics("m", "1", "2", metrics, metrics, {}, {}, curves_a={"long_retrieval": tiny},
                          curves_b={"long_retrieval": curve})
    assert cmp.context["long_retrieval"]["verdict"] == "not comparable"
