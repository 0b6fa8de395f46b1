"""Prompt lookup's two pure parts: which tokens it proposes, and the rejection rule that keeps sampled output
distributed as the target's (a naive rule fails the same test, so the test has the power to see it)."""

import pytest
import torch
from scipy.stats import chisquare

from temper.rollout.decoding import SamplingParams
from temper.rollout.lookup import propose, verify


def test_propose_follows_the_latest_match_of_the_longest_suffix_ngram():
    #        0  1  2  3  4  5  6  7  8  9
    seq = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert propose(seq, k=3) == [4, 7, 1]  # "1 2" last seen at 4..5 (not 0..1): the latest match wins
    assert propose([5, 6, 7, 5, 6, 8, 3, 6], k=2) == [8, 3]  # no "3 6" before: the 1-gram "6" at 4
    assert propose([5, 6, 7, 5, 6, 7, 5, 6], k=2, max_ngram=3) == [7, 5]  # "7 5 6" at 2..4
    assert propose([1, 2, 3], k=4) == []  # 3 never occurred before
    assert propose([4, 4], k=5) == [4]  # only what the sequence holds
    assert propose([1, 2, 1], k=0) == [] and propose([1], k=3) == []


def test_greedy_verify_keeps_the_matching_prefix_and_the_targets_next_token():
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([2, 3, 5, 1]):
        logits[row, best] = 5.0
    greedy = SamplingParams(temperature=0, logprobs=True)
    tokens, lps, accepted = verify(logits, [2, 3, 4], greedy, None)
    assert tokens == [2, 3, 5] and accepted == 2  # 4 rejected: the target's 5 instead, nothing after it
    assert lps == pytest.approx(logits[:3].log_softmax(-1)[range(3), [2, 3, 5]].tolist())
    assert verify(logits, [2, 3, 5], greedy, None)[0] == [2, 3, 5, 1]  # all accepted: plus the bonus token
    assert verify(logits[:1], [], greedy, None)[0] == [2]  # no draft: one standard step


P0 = torch.tensor([0.1, 0.2, 0.3, 0.4])
P1 = torch.tensor([0.5, 0.25, 0.125, 0.125])
DRAFT = [1, 2]  # a draft the target gives 0.2 at the first position and 0.125 at the second


def _draws(rule, n=4_000):
    g = torch.Generator().manual_seed(0)
    logits = torch.stack([P0.log(), P1.log(), P1.log()])
    firsts, seconds = [0] * 4, [0] * 4
    params = SamplingParams(temperature=1.0)
    for _ in range(n):
        tokens = rule(logits, DRAFT, params, g)
        firsts[tokens[0]] += 1
        if len(tokens) > 1:  # a second token comes only after the first draft was accepted
            seconds[tokens[1]] += 1
    return firsts, seconds


def _naive(logits, draft, params, g):
    """Accept a draft token whenever the target gives it at least 10%: plausible, and wrong."""
    probs = logits.softmax(-1)
    out = []
    for i, x in enumerate(draft):
        if probs[i, x] >= 0.1:
            out.append(x)
            continue
        return out + [int(torch.multinomial(probs[i], 1, generator=g))]
    return out + [int(torch.multinomial(probs[len(draft)], 1, generator=g))]


def _fits(counts, p):
    expected = [q * sum(counts) for q in p.double().tolist()]
    expected[-1] = sum(counts) - sum(expected[:-1])  # sums agree exactly, as chisquare requires
    return chisquare(counts, expected).pvalue > 1e-3


def test_sampled_tokens_are_distributed_as_the_targets_under_the_rejection_rule():
    firsts, seconds = _draws(lambda *a: verify(*a)[0])
    assert _fits(firsts, P0) and _fits(seconds, P1)
    naive_firsts, naive_seconds = _draws(_naive)
    assert not _fits(naive_firsts, P0) and not _fits(naive_seconds, P1)
