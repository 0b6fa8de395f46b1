"""The fast profile's draft length: the measured cost of verifying against a request's acceptance."""

from __future__ import annotations

import pytest

from temper.rollout.draft_cost import Acceptance, ForwardCost, draft_length


def cpu_like(positions: int) -> float:
    """SmolLM2 on 2 cores, roughly: 70 ms for one position, +35 ms to verify at all, +2.5 ms a position."""
    return 0.0675 + 0.0025 * positions + (0.035 if positions > 1 else 0.0)


def test_the_fit_recovers_the_cost_of_verifying_and_of_each_position():
    cost = ForwardCost()
    for i in range(40):  # one request: plain steps and drafts of 1..6
        cost.observe(1 + i % 7, 1, cpu_like(1 + i % 7))
    per_position, verify = cost.fit()
    assert per_position == pytest.approx(0.0025, rel=1e-3) and verify == pytest.approx(0.035, rel=1e-3)
    rate = cost.tokens_per_s
    assert cost.draft_cost(0) == 0.0
    assert cost.draft_cost(4) == pytest.approx((0.035 + 4 * 0.0025) * rate, rel=1e-3)  # alone: the verify step too


def test_in_a_batch_a_draft_pays_only_its_positions():
    cost = ForwardCost()
    for i in range(40):  # 8 rows, each forward already more than one position
        cost.observe(8 + i % 5, 8, cpu_like(8 + i % 5))
    assert cost.draft_cost(3) == pytest.approx(3 * cost.fit()[0] * cost.tokens_per_s, rel=1e-3)


def test_the_cost_is_unknown_until_warmup_forwards_and_a_zero_time_forward_is_not_one():
    cost = ForwardCost(warmup=4)
    for positions in (1, 3, 1):
        cost.observe(positions, 1, cpu_like(positions))
    assert cost.fit() is None and cost.draft_cost(2) is None
    cost.observe(1, 1, 0.0)
    assert cost.n == 3
    cost.observe(5, 1, cpu_like(5))
    assert cost.fit() is not None


@pytest.mark.parametrize("first, then, k", [
    (0.05, 0.9, 0),  # rarely copies: no draft is worth verifying
    (0.4, 0.2, 0),  # short runs: 0.4 + 0.08 tokens do not pay the verify step (~0.6 of a token)
    (0.4, 0.9, 16),  # long runs: every position pays once the verify step is paid
    (0.9, 0.5, 5),  # the 6th token (0.9 * 0.5^5 = 0.028) is worth less than its position (0.035)
])
def test_the_draft_length_is_the_most_tokens_over_their_cost(first, then, k):
    def cost(n):  # one request alone: verifying costs 0.5 of a token, each position 0.035
        return 0.5 + 0.035 * n

    assert draft_length(first, then, cost, 16) == k


def test_free_positions_draft_all_allowed_and_no_room_drafts_none():
    assert draft_length(0.3, 0.5, lambda n: 0.0, 7) == 7
    assert draft_length(0.9, 0.9, lambda n: 0.0, 0) == 0


def test_acceptance_tells_first_tokens_from_the_tokens_after_them():
    a = Acceptance()
    assert a.first == a.then == 0.5  # the prior
    for _ in range(20):  # a copier: half its drafts miss at once, the other half are taken whole
        a.update(8, 0)
        a.update(8, 8)
    assert 0.4 < a.first < 0.6 and a.then > 0.95
    for _ in range(40):  # it stops copying: every first token rejected; the run rate is kept, not relearned
        a.update(1, 0)
    assert a.first < 0.1 and a.then > 0.95
