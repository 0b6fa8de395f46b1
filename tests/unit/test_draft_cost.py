"""The fast profile's draft length: the measured cost of a position against a request's acceptance."""

from __future__ import annotations

import pytest

from temper.rollout.draft_cost import Acceptance, ForwardCost, draft_length


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


@pytest.mark.parametrize("first, then, value, k_max, k", [
    (0.9, 0.9, 0.12, 16, 16),  # 0.9 * 0.9^15 = 0.185 > 0.12: all 16
    (0.7, 0.7, 0.12, 16, 5),  # 0.7^5 = 0.168 > 0.12 >= 0.7^6 = 0.118
    (0.5, 0.5, 0.12, 16, 3),  # 0.125 > 0.12
    (0.5, 0.5, 0.125, 16, 2),  # 0.5^3 equals the value: not above it
    (0.3, 0.9, 0.12, 16, 9),  # copying in runs: a rare first hit, then long: 0.3 * 0.9^8 = 0.129 > 0.12
    (0.1, 0.95, 0.12, 16, 0),  # first tokens fail more often than a position is worth: none
    (0.5, 0.9, 0.52, 16, 0),  # batch 8 on a CPU: a position costs half a token
    (0.8, 0.8, 0.52, 16, 2),
    (0.6, 0.1, 0.12, 16, 1),  # the first pays, the second (0.06) does not
    (0.5, 0.5, 0.0, 7, 7),  # free positions: as many as allowed
    (0.5, 0.5, 0.1, 0, 0),  # no room left
])
def test_the_draft_length_is_the_last_token_expected_to_pay(first, then, value, k_max, k):
    assert draft_length(first, then, value, k_max) == k


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
