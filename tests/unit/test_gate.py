import numpy as np
import pytest

from temper.registry.bootstrap import bootstrap_delta, holm
from temper.registry.gate import PromotionPolicy, decide

POLICY = PromotionPolicy(min_improvement=0.01, max_regression=0.05)


def test_better_everywhere_passes():
    d = decide({"a": 0.6, "b": 0.5}, {"a": 0.4, "b": 0.4}, POLICY)
    assert d.passed and d.deltas == pytest.approx({"a": 0.2, "b": 0.1})


def test_better_on_average_but_worse_on_one_domain_fails():
    d = decide({"a": 0.9, "b": 0.3}, {"a": 0.4, "b": 0.4}, POLICY)
    assert not d.passed and "b regressed by 0.100" in d.reason


def test_tie_keeps_the_champion():
    d = decide({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}, POLICY)
    assert not d.passed and "tie keeps the champion" in d.reason


def test_first_model_needs_min_reward():
    assert decide({"a": 0.2}, None, PromotionPolicy(min_reward=0.1)).passed
    d = decide({"a": 0.2, "b": 0.05}, None, PromotionPolicy(min_reward=0.1))
    assert not d.passed and "b mean reward 0.050" in d.reason


def test_no_common_domains_fails_clearly():
    d = decide({"a": 0.9}, {"b": 0.1}, POLICY)
    assert not d.passed and "share no evaluated domain" in d.reason


# ---- per-domain significance (paired bootstrap, Holm over domains) ---------------------------


def _samples(rewards) -> list[tuple[str, float]]:
    return [(f"id{i}", float(r)) for i, r in enumerate(rewards)]


def _suite(n_domains: int, n_items: int, seed: int) -> dict[str, list[tuple[str, float]]]:
    rng = np.random.default_rng(seed)
    return {f"d{k:03d}": _samples(rng.random(n_items) < rng.uniform(0.2, 0.8)) for k in range(n_domains)}


def _means(samples):
    return {d: float(np.mean([r for _, r in s])) for d, s in samples.items()}


def test_two_identical_models_never_see_a_regression_at_300_domains():
    champ = _suite(300, 64, seed=1)
    d = decide(_means(champ), _means(champ), PromotionPolicy(), champ, champ)
    assert d.regressed == [] and list(d.p_values.values()) == pytest.approx([1.0] * len(d.p_values))
    assert "tie keeps the champion" in d.reason


def test_noise_alone_does_not_regress_but_the_old_threshold_did():
    """Two equally good models, each domain re-sampled (independent 64-item evals, p per domain
    fixed): the bare 0.05 threshold flags dozens of domains; the corrected test flags none."""
    rng = np.random.default_rng(7)
    p = rng.uniform(0.2, 0.8, 300)
    champ = {f"d{k:03d}": _samples(rng.random(64) < p[k]) for k in range(300)}
    cand = {f"d{k:03d}": _samples(rng.random(64) < p[k]) for k in range(300)}
    bare = decide(_means(cand), _means(champ), PromotionPolicy())  # no samples: the threshold alone
    assert not bare.passed and "regressed" in bare.reason
    assert sum(v < -0.05 for v in bare.deltas.values()) > 50
    d = decide(_means(cand), _means(champ), PromotionPolicy(), cand, champ)
    assert d.regressed == [], d.reason


def test_a_real_regression_on_one_domain_is_caught_among_300():
    champ = _suite(300, 64, seed=2)
    cand = {k: list(v) for k, v in champ.items()}
    cand["d123"] = [(i, 0.0 if n < 40 else r) for n, (i, r) in enumerate(champ["d123"])]  # 40 of 64 items broken
    for k in ("d001", "d002"):  # and a real gain elsewhere, so the mean improves
        cand[k] = [(i, 1.0) for i, _ in champ[k]]
    d = decide(_means(cand), _means(champ), PromotionPolicy(), cand, champ)
    assert not d.passed and d.regressed == ["d123"]
    assert d.reason.startswith("d123 regressed by ") and "holm-corrected over 300 domain(s)" in d.reason


def test_holm_steps_down_and_bootstrap_uses_scipy_intervals():
    assert holm({"a": 0.001, "b": 0.02, "c": 0.04}, 0.05) == {"a", "b", "c"}  # 0.05/3, 0.05/2, 0.05/1
    assert holm({"a": 0.001, "b": 0.03, "c": 0.04}, 0.05) == {"a"}
    iv = bootstrap_delta(_samples([1] * 20 + [0] * 20), _samples([0] * 40))
    assert iv.paired and iv.delta == pytest.approx(-0.5) and iv.hi < 0 and iv.se > 0 and iv.p_worse() < 1e-6
