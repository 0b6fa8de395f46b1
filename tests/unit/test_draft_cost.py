"""The fast profile's draft length: the measured cost of a position against a request's acceptance."""

from __future__ import annotations

import pytest

from temper.rollout.draft_cost import ForwardCost, acceptance, draft_length


def test_the_forward_cost_line_recovers_the_cost_of_a_position_and_its_value_in_tokens():
    cost = ForwardCost()
    for i in range(40):  # 8 rows decoding, 0..6 extra draft positions: 30 ms + 4 ms a position
        positions = 8 + i % 7
        cost.observe(positions, 8, 0.030 + 0.004 * positions)
    assert cost.per_position() == pytest.approx(0.004, rel=1e-6)
    rate = cost.tokens_per_s  # 8 tokens per 0.062 .. 0.086 s
    assert 93 < rate < 130 and cost.position_value() == pytest.approx(0.004 * rate)


def test_the_cost_is_unknown_until_forwards_of_different_sizes_were_seen():
    cost = ForwardCost(warmup=4)
    for _ in range(20):
        cost.observe(8, 8, 0.05)  # every forward the same size: no slope to fit
    assert cost.per_position() is None and cost.position_value() is None
    cost = ForwardCost(warmup=4)
    for positions in (1, 3, 1):
        cost.observe(positions, 1, 0.03 + 0.004 * positions)
    assert cost.per_position() is None  # fewer than warmup
    cost.observe(5, 1, 0.05)
    assert cost.per_position() == pytest.approx(0.004, rel=1e-6)
    cost.observe(1, 1, 0.0)  # a zero-time forward (a clock's tick) is not a measurement
    assert cost.n == 4


@pytest.mark.parametrize("q, value, k_max, k", [
    (0.9, 0.12, 16, 16),  # 0.9^16 = 0.185 > 0.12: all 16
    (0.7, 0.12, 16, 5),  # 0.7^5 = 0.168 > 0.12 >= 0.7^6 = 0.118
    (0.5, 0.12, 16, 3),  # 0.125 > 0.12
    (0.5, 0.125, 16, 2),  # 0.5^3 equals the value: not above it
    (0.1, 0.12, 16, 0),  # drafts fail more often than a position is worth: none
    (0.5, 0.52, 16, 0),  # batch 8 on a CPU: a position costs half a token
    (0.8, 0.52, 16, 2),
    (0.5, 0.0, 7, 7),  # free positions: as many as allowed
    (0.5, 0.1, 0, 0),  # no room left
])
def test_the_draft_length_is_the_last_token_expected_to_pay(q, value, k_max, k):
    assert draft_length(q, value, k_max) == k


def test_acceptance_starts_at_a_half_and_follows_the_request():
    assert acceptance(0, 0) == 0.5
    assert acceptance(9, 1) == pytest.approx(10 / 12)
    assert acceptance(0, 10) == pytest.approx(1 / 12)
