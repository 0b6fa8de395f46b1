from temper.registry.gate import PromotionPolicy, decide

POLICY = PromotionPolicy(min_improvement=0.01, max_regression=0.05)


def test_better_everywhere_passes():
    d = decide({"a": 0.6, "b": 0.5}, {"a": 0.4, "b": 0.4}, POLICY)
    assert d.passed and d.deltas == {"a": 0.19999999999999996, "b": 0.09999999999999998}


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
