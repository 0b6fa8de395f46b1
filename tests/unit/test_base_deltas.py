"""Candidate vs base per domain: paired intervals, Holm verdicts in both directions, means with intervals."""

from temper.registry.base_deltas import domain_deltas, mean_delta, verdict_counts


def samples(values):
    return [(f"i{k}", v) for k, v in enumerate(values)]


def test_verdicts_follow_the_paired_test_after_holm_in_each_direction():
    n = 32
    base = {"up": samples([0.0] * n), "down": samples([1.0] * n), "noise": samples([0.0, 1.0] * (n // 2)),
            "slight": samples([0.0] * n)}
    cand = {"up": samples([1.0] * 20 + [0.0] * 12), "down": samples([0.0] * 20 + [1.0] * 12),
            "noise": samples([1.0, 0.0] * (n // 2)), "slight": samples([1.0] + [0.0] * (n - 1))}
    deltas = domain_deltas(base, cand)
    assert {d: x.verdict for d, x in deltas.items()} == {"up": "better", "down": "worse", "noise": "unchanged",
                                                          "slight": "unchanged"}
    up = deltas["up"]
    assert abs(up.delta - 20 / 32) < 1e-9 and up.lo > 0 and up.hi <= 1.0 and up.base == 0.0
    assert verdict_counts(deltas, ["up", "noise", "absent"]) == {"better": 1, "unchanged": 1, "worse": 0}


def test_an_unpaired_or_missing_domain_is_left_out_and_unscored_items_do_not_count():
    base = {"a": samples([0.0, None, 0.0, 0.0]), "only_base": samples([1.0])}
    cand = {"a": samples([1.0, 1.0, 1.0, 1.0]), "only_cand": samples([1.0])}
    deltas = domain_deltas(base, cand)
    assert set(deltas) == {"a"}
    mean = mean_delta(base, cand, ["a", "only_cand"])
    assert mean.domains == 1 and mean.base == 0.0 and mean.candidate == 1.0 and mean.lo == mean.hi == 1.0


def test_the_mean_over_domains_weighs_domains_equally_and_its_interval_covers_it():
    base = {"a": samples([0.0] * 40), "b": samples([0.0] * 10)}
    cand = {"a": samples([1.0] * 40), "b": samples([0.0] * 5 + [1.0] * 5)}
    m = mean_delta(base, cand, ["a", "b"])
    assert abs(m.delta - 0.75) < 1e-9  # (1.0 + 0.5) / 2, not pooled items' 45/50
    assert m.lo <= m.delta <= m.hi and m.lo > 0.5 and m.hi <= 1.0
    assert mean_delta(base, cand, []) is None


def test_a_uniform_shift_is_judged_by_the_sign_test_not_taken_as_certain():
    """Every item moved by the same 0.01 (a format credit): the bootstrap has no spread and would call it certain;
    4 such items are not evidence (p = 0.125), 32 are."""
    few = domain_deltas({"d": samples([0.0] * 4)}, {"d": samples([0.01] * 4)})
    many = domain_deltas({"d": samples([0.0] * 32)}, {"d": samples([0.01] * 32)})
    assert few["d"].verdict == "unchanged" and many["d"].verdict == "better"


def test_one_unscored_item_keeps_the_comparison_paired():
    base = {"d": samples([0.0, 1.0] * 16)}
    cand = {"d": samples([None] + [1.0, 1.0] * 15 + [1.0])}  # item 0 unscored on the candidate's side
    x = domain_deltas(base, cand)["d"]
    assert abs(x.delta - 15 / 31) < 1e-9 and abs(x.base - 16 / 31) < 1e-9  # the 31 items both sides scored
    assert x.verdict == "better" and x.lo > 0
