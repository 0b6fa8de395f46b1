"""The GRPO curriculum: weight update, stratification under changing weights, exact replay, off = fixed mix."""

from __future__ import annotations

import json
import random

import pytest

from temper.training.config import CurriculumSettings, GRPOSettings, TrainConfig, TrainingError, nest_stage_fields
from temper.training.curriculum import Curriculum, CurriculumStream, lazy_dataset, replay
from temper.training.mixing import DomainMixSampler

ON = CurriculumSettings(enabled=True)


def test_solved_and_hopeless_domains_lose_weight_and_a_mid_one_gains_within_bounds():
    c = Curriculum(["solved", "hopeless", "mid", "unseen"], ON)
    assert set(c.multipliers().values()) == {1.0}  # nothing seen: every domain is worth trying
    for _ in range(6):  # [scored, passed, groups, groups with signal]
        c.observe({"solved": [8, 8, 2, 0], "hopeless": [8, 0, 2, 0], "mid": [8, 4, 2, 2]})
    after = c.multipliers()
    assert (c.pass_rate("solved"), c.pass_rate("hopeless")) == (pytest.approx(1, abs=0.01), pytest.approx(0, abs=0.01))
    shares = {n: m / sum(after.values()) for n, m in after.items()}
    assert shares["mid"] > 0.25 > shares["solved"] and shares["hopeless"] < 0.25
    assert after["mid"] == 1.0 and after["unseen"] == 1.0
    assert ON.min_multiplier <= after["solved"] < 0.2 and ON.min_multiplier <= after["hopeless"] < 0.2
    for _ in range(200):  # all-pass / all-fail for long: down to the floor, never below it
        c.observe({"solved": [8, 8, 2, 0], "hopeless": [8, 0, 2, 0]})
    assert all(ON.min_multiplier <= m <= 1.0 for m in c.multipliers().values())
    assert c.multipliers()["solved"] == pytest.approx(ON.min_multiplier, abs=1e-6)


def test_a_mid_pass_rate_without_signal_is_not_rewarded():
    """Prompts each always or never solved: pass rate 0.5, yet every group is all-equal."""
    c = Curriculum(["split", "mixed"], ON)
    for _ in range(8):
        c.observe({"split": [8, 4, 2, 0], "mixed": [8, 4, 2, 2]})
    assert c.pass_rate("split") == pytest.approx(c.pass_rate("mixed"))
    assert c.multipliers()["split"] < 0.2 < 0.99 < c.multipliers()["mixed"]


def test_recent_rates_forget_at_the_window():
    c = Curriculum(["d"], CurriculumSettings(enabled=True, window=2))
    for _ in range(20):
        c.observe({"d": [4, 4, 1, 0]})  # solved...
    for _ in range(6):
        c.observe({"d": [4, 2, 1, 1]})  # ... then the data got harder: back to mid within a few steps
    assert c.pass_rate("d") == pytest.approx(0.5, abs=0.02) and c.signal_rate("d") > 0.98
    slow = Curriculum(["d"], CurriculumSettings(enabled=True, window=50))
    for totals in [{"d": [4, 4, 1, 0]}] * 20 + [{"d": [4, 2, 1, 1]}] * 6:
        slow.observe(totals)
    assert slow.pass_rate("d") > 0.75 and slow.signal_rate("d") < 0.5  # a long window still remembers


def fake_rewards(stream: CurriculumStream, batch: int, difficulty: dict[str, float], g: int) -> dict:
    """Deterministic per-step totals for the batch's slots, a stand-in for gathered verifier results:
    each slot's group passes about difficulty[d] x g of its completions."""
    totals: dict[str, list[int]] = {}
    p = stream.prompts_per_step
    for i in range(batch * p, (batch + 1) * p):
        name, idx = stream.slot(i)
        passed = max(0, min(g, round(g * difficulty[name] + 0.3 * ((idx % 3) - 1))))
        row = totals.setdefault(name, [0, 0, 0, 0])
        row[0], row[1], row[2], row[3] = row[0] + g, row[1] + passed, row[2] + 1, row[3] + (0 < passed < g)
    return totals


def run_stream(stream: CurriculumStream, start: int, steps: int, difficulty: dict, g: int = 4) -> list:
    """Drive the stream as the trainer does: the loader reads batch b+1 while step b runs, then b is observed."""
    drawn = []
    for batch in range(start, steps):
        p = stream.prompts_per_step
        drawn += [stream.slot(i) for i in range(batch * p, (batch + 1) * p)]
        stream.slot((batch + 2) * p - 1)  # the prefetched next batch
        stream.observe(batch, fake_rewards(stream, batch, difficulty, g))
    return drawn


def make_sampler(names, seed=3):
    return DomainMixSampler(sizes={n: 7 for n in names}, ratios={n: 1.0 + (i % 3) for i, n in enumerate(names)},
                            seed=seed)


def test_resumed_stream_draws_exactly_what_the_uninterrupted_one_drew():
    rng = random.Random(0)
    names = [f"d{i:02d}" for i in range(30)]
    difficulty = {n: rng.choice([0.0, 1.0, 0.5, 0.25]) for n in names}
    straight = CurriculumStream(make_sampler(names), ON, prompts_per_step=4)
    full = run_stream(straight, 0, 40, difficulty)

    first = CurriculumStream(make_sampler(names), ON, prompts_per_step=4)
    head = run_stream(first, 0, 15, difficulty)
    saved = json.loads(json.dumps(replay(make_sampler(names), ON, 4, first.observations, 15).state_dict()))
    resumed = replay(make_sampler(names), ON, 4, saved["observations"], 15)
    assert resumed.state_dict() == saved  # what the resume check compares
    tail = run_stream(resumed, 15, 40, difficulty)
    assert head + tail == full
    assert resumed.observations == straight.observations
    assert resumed.weights(39) == straight.weights(39) and resumed.curriculum.state_dict() == \
        straight.curriculum.state_dict()
    # every batch's weights stay within [floor, 1/floor] x the domain's base share
    sampler = make_sampler(names)
    base = {n: r / sum(sampler.ratios.values()) for n, r in sampler.ratios.items()}
    ratios = [straight.weights(b)[n] / base[n] for b in range(40) for n in names]
    assert ON.min_multiplier - 1e-12 <= min(ratios) < 0.5 and 1.2 < max(ratios) <= 1 / ON.min_multiplier + 1e-12
    # and the curriculum really moved: solved/hopeless domains were sampled less than mid ones late on
    late = [name for name, _ in full[-80:]]
    mid = [n for n in names if difficulty[n] in (0.5, 0.25)]
    extreme = [n for n in names if difficulty[n] in (0.0, 1.0)]
    assert sum(late.count(n) for n in mid) / len(mid) > 2 * sum(late.count(n) for n in extreme) / len(extreme)


def test_a_different_seed_or_log_gives_a_different_replay():
    names = [f"d{i}" for i in range(6)]
    difficulty = dict(zip(names, [0.0, 1.0, 0.5, 0.5, 1.0, 0.0]))
    a = CurriculumStream(make_sampler(names, seed=1), ON, 4)
    b = CurriculumStream(make_sampler(names, seed=1), ON, 4)
    c = CurriculumStream(make_sampler(names, seed=2), ON, 4)
    assert run_stream(a, 0, 12, difficulty) == run_stream(b, 0, 12, difficulty) != run_stream(c, 0, 12, difficulty)


def test_stratified_under_changing_weights_at_every_prefix():
    """Counts track each domain's cumulative target (the sum of the weights in force at each slot)
    within 1, at every slot, over 300 domains whose weights change every batch."""
    rng = random.Random(9)
    names = [f"d{i:03d}" for i in range(300)]
    base = {n: rng.choice([0.5, 1.0, 2.0, 3.0]) for n in names}
    s = DomainMixSampler(sizes={n: rng.randint(3, 30) for n in names}, ratios=base, seed=4)
    target = dict.fromkeys(names, 0.0)
    counts = dict.fromkeys(names, 0)
    worst = 0.0
    for batch in range(600):
        s.reweight({n: base[n] * rng.uniform(0.1, 1.0) for n in names})
        weights = s.current_weights()
        for name, _ in s.take(4):
            counts[name] += 1
            for n in names:
                target[n] += weights[n]
            worst = max(worst, max(abs(counts[n] - target[n]) for n in (name, *names[::37])))
    assert worst < 1.0, worst
    assert max(abs(counts[n] - target[n]) for n in names) < 1.0


def fixed_rule_stream(sizes: dict[str, int], ratios: dict[str, float], seed: int, n: int) -> list[tuple[str, int]]:
    """The fixed mix as the sampler computed it before the curriculum existed (Tijdeman, seeded ties)."""
    names = sorted(ratios)
    total = sum(ratios[x] for x in names)
    weights = {x: ratios[x] / total for x in names}
    order = list(range(len(names)))
    random.Random(f"mix:{seed}").shuffle(order)
    tie = {names[i]: rank for rank, i in enumerate(order)}
    count, epoch, cursor, perm, out = dict.fromkeys(names, 0), dict.fromkeys(names, 0), dict.fromkeys(names, 0), {}, []
    for x in names:
        perm[x] = list(range(sizes[x]))
        random.Random(f"perm:{seed}:{x}:0").shuffle(perm[x])
    for pos in range(n):
        due = [x for x in names if (pos + 1) * weights[x] - count[x] > 1e-12]
        x = min(due, key=lambda d: ((count[d] + 1) / weights[d], tie[d]))
        count[x] += 1
        if cursor[x] >= sizes[x]:
            epoch[x] += 1
            perm[x] = list(range(sizes[x]))
            random.Random(f"perm:{seed}:{x}:{epoch[x]}").shuffle(perm[x])
            cursor[x] = 0
        out.append((x, perm[x][cursor[x]]))
        cursor[x] += 1
    return out


@pytest.mark.parametrize("k", [2, 7, 300])
def test_curriculum_off_the_stream_is_the_fixed_one(k):
    rng = random.Random(k)
    ratios = {f"d{i}": rng.choice([0.5, 1.0, 0.7, 3.0]) for i in range(k)}
    sizes = {n: rng.randint(1, 30) for n in ratios}
    sampler = DomainMixSampler(sizes=sizes, ratios=ratios, seed=k)
    assert sampler.take(2000) == fixed_rule_stream(sizes, ratios, k, 2000)
    assert "anchor" not in sampler.state_dict()  # checkpoints of fixed runs keep their old form


def test_a_draw_that_would_need_unobserved_rewards_is_refused():
    stream = CurriculumStream(make_sampler(["a", "b"]), ON, prompts_per_step=2)
    stream.slot(3)  # batches 0 and 1 need no observation
    with pytest.raises(TrainingError, match="needs the rewards of step 1"):
        stream.slot(4)
    with pytest.raises(TrainingError, match="no gap"):
        stream.observe(1, {"a": [4, 1, 1, 1]})
    stream.observe(0, {"a": [4, 1, 1, 1]})
    stream.observe(0, {"a": [4, 1, 1, 1]})  # the same step again (a re-logged step) is harmless
    with pytest.raises(TrainingError, match="twice with different counts"):
        stream.observe(0, {"a": [4, 2, 1, 1]})
    assert stream.slot(4)[0] in ("a", "b")


def test_lazy_dataset_renders_slots_when_read():
    stream = CurriculumStream(make_sampler(["a", "b"]), ON, prompts_per_step=2)
    ds = lazy_dataset(stream, 8, lambda name, idx: {"prompt": f"{name}:{idx}", "domain": name})
    assert len(stream.slots) == 0  # nothing decided before the loader reads
    rows = ds.__getitems__([0, 0, 1, 1])
    assert [r["prompt"] for r in rows] == [f"{n}:{i}" for n, i in [stream.slot(0)] * 2 + [stream.slot(1)] * 2]
    assert [r["slot"] for r in rows] == [0, 0, 1, 1]  # the reward function groups completions by it
    assert len(stream.slots) == 2


def test_settings_are_validated_and_fingerprinted_only_when_on(tmp_path):
    from temper.training.checkpoint import training_fingerprint

    with pytest.raises(ValueError, match="min_multiplier"):
        GRPOSettings(curriculum={"enabled": True, "min_multiplier": 0})
    with pytest.raises(ValueError, match="window"):
        GRPOSettings(curriculum={"window": 0.5})

    def cfg(curriculum):
        return TrainConfig.model_validate(nest_stage_fields(dict(
            mode="grpo", run_name="r", base_model="/m", output_dir="/o", curriculum=curriculum)))

    assert training_fingerprint(cfg({})) == training_fingerprint(cfg({"window": 9}))  # off: knobs change nothing
    assert training_fingerprint(cfg({})) != training_fingerprint(cfg({"enabled": True}))
    assert training_fingerprint(cfg({"enabled": True})) != training_fingerprint(cfg({"enabled": True, "window": 9}))


def test_groups_are_joined_by_slot_across_ranks_and_judged_by_their_spread():
    from temper.data.catalog import load_catalog
    from temper.training.rewards import DomainRewards, step_totals
    from tests.conftest import REPO

    arithmetic = load_catalog(REPO / "domains")["arithmetic"]
    record = json.dumps({"question": "2+3", "answer": "5"})
    ranks = [DomainRewards([arithmetic]), DomainRewards([arithmetic])]
    # slot 7's group of 4 is split over the two ranks: 2 right on rank 0, 2 wrong on rank 1 -> signal;
    # slot 8's group is all right -> no signal; slot 9: one judged reward only -> not a judged group.
    ranks[0](["p"] * 4, ["5", "5", "5", "5"], ["arithmetic"] * 4, [record] * 4, slot=[7, 7, 8, 8])
    ranks[1](["p"] * 3, ["4", "4", "5"], ["arithmetic"] * 3, [record] * 3, slot=[7, 7, 8])
    ranks[1](["p"] * 2, ["5", "5"], ["arithmetic"] * 2, [record] * 2, slot=[8, 9])
    totals = step_totals([r.summary() for r in ranks], [r.groups for r in ranks])
    assert totals == {"arithmetic": [9, 7, 2, 1]}  # [scored, passed, groups, groups with signal]
    ranks[0].reset_stats()
    assert ranks[0].groups == {}
    plain = DomainRewards([arithmetic])  # the fixed stream has no slot column: nothing grouped
    plain(["p"], ["5"], ["arithmetic"], [record])
    assert plain.groups == {} and step_totals([plain.summary()], [plain.groups]) == {"arithmetic": [1, 1, 0, 0]}
