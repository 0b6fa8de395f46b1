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
    c = Curriculum(["solved", "hopeless", "mid", "unseen"], ON, group_size=4)
    before = c.multipliers()
    assert set(before.values()) == {1.0}  # nothing seen: every domain at the prior, the peak
    for _ in range(6):
        c.observe({"solved": [8, 8], "hopeless": [8, 0], "mid": [8, 4]})
    after = c.multipliers()
    shares = {n: m / sum(after.values()) for n, m in after.items()}
    assert shares["mid"] > 0.25 > shares["solved"] and shares["hopeless"] < 0.25
    assert after["mid"] == pytest.approx(1.0) and after["unseen"] == 1.0
    # all-pass / all-fail for long: down to the floor, never below it
    assert ON.min_multiplier <= after["solved"] < 0.2 and ON.min_multiplier <= after["hopeless"] < 0.2
    for _ in range(200):
        c.observe({"solved": [8, 8], "hopeless": [8, 0]})
    assert all(ON.min_multiplier <= m <= 1.0 for m in c.multipliers().values())
    assert c.multipliers()["solved"] == pytest.approx(ON.min_multiplier, abs=1e-6)


def test_recent_pass_rate_forgets_at_the_window():
    c = Curriculum(["d"], CurriculumSettings(enabled=True, window=2), group_size=4)
    for _ in range(20):
        c.observe({"d": [4, 4]})  # solved...
    for _ in range(6):
        c.observe({"d": [4, 2]})  # ... then the data got harder: back to mid within a few batches
    assert c.pass_rate("d") == pytest.approx(0.5, abs=0.02)
    slow = Curriculum(["d"], CurriculumSettings(enabled=True, window=50), group_size=4)
    for totals in [{"d": [4, 4]}] * 20 + [{"d": [4, 2]}] * 6:
        slow.observe(totals)
    assert slow.pass_rate("d") > 0.75  # a long window still remembers


def fake_rewards(stream: CurriculumStream, batch: int, difficulty: dict[str, float], g: int) -> dict:
    """Deterministic per-step (scored, passed) for the batch's slots: domain d passes a fraction
    difficulty[d] of its completions (rounded), a stand-in for gathered verifier results."""
    totals: dict[str, list[int]] = {}
    p = stream.prompts_per_step
    for i in range(batch * p, (batch + 1) * p):
        name, idx = stream.slot(i)
        passed = round(g * difficulty[name] + 0.3 * ((idx % 3) - 1))
        scored, ok = totals.get(name, [0, 0])
        totals[name] = [scored + g, ok + max(0, min(g, passed))]
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
    straight = CurriculumStream(make_sampler(names), ON, 4, prompts_per_step=4)
    full = run_stream(straight, 0, 40, difficulty)

    first = CurriculumStream(make_sampler(names), ON, 4, prompts_per_step=4)
    head = run_stream(first, 0, 15, difficulty)
    saved = json.loads(json.dumps(replay(make_sampler(names), ON, 4, 4, first.observations, 15).state_dict()))
    resumed = replay(make_sampler(names), ON, 4, 4, saved["observations"], 15)
    assert resumed.state_dict() == saved  # what the resume check compares
    tail = run_stream(resumed, 15, 40, difficulty)
    assert head + tail == full
    assert resumed.observations == straight.observations
    assert resumed.weights(39) == straight.weights(39) and resumed.curriculum.state_dict() == \
        straight.curriculum.state_dict()
    # and the curriculum really moved: solved/hopeless domains were sampled less than mid ones late on
    late = [name for name, _ in full[-80:]]
    mid = [n for n in names if difficulty[n] in (0.5, 0.25)]
    extreme = [n for n in names if difficulty[n] in (0.0, 1.0)]
    assert sum(late.count(n) for n in mid) / len(mid) > 2 * sum(late.count(n) for n in extreme) / len(extreme)


def test_a_different_seed_or_log_gives_a_different_replay():
    names = [f"d{i}" for i in range(6)]
    difficulty = dict(zip(names, [0.0, 1.0, 0.5, 0.5, 1.0, 0.0]))
    a = CurriculumStream(make_sampler(names, seed=1), ON, 4, 4)
    b = CurriculumStream(make_sampler(names, seed=1), ON, 4, 4)
    c = CurriculumStream(make_sampler(names, seed=2), ON, 4, 4)
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
    stream = CurriculumStream(make_sampler(["a", "b"]), ON, 4, prompts_per_step=2)
    stream.slot(3)  # batches 0 and 1 need no observation
    with pytest.raises(TrainingError, match="needs the rewards of step 1"):
        stream.slot(4)
    with pytest.raises(TrainingError, match="no gap"):
        stream.observe(1, {"a": [4, 1]})
    stream.observe(0, {"a": [4, 1]})
    stream.observe(0, {"a": [4, 1]})  # the same step again (a re-logged step) is harmless
    with pytest.raises(TrainingError, match="twice with different counts"):
        stream.observe(0, {"a": [4, 2]})
    assert stream.slot(4)[0] in ("a", "b")


def test_lazy_dataset_renders_slots_when_read():
    stream = CurriculumStream(make_sampler(["a", "b"]), ON, 4, prompts_per_step=2)
    ds = lazy_dataset(stream, 8, lambda name, idx: {"prompt": f"{name}:{idx}", "domain": name})
    assert len(stream.slots) == 0  # nothing decided before the loader reads
    rows = ds.__getitems__([0, 0, 1, 1])
    assert [r["prompt"] for r in rows] == [f"{n}:{i}" for n, i in [stream.slot(0)] * 2 + [stream.slot(1)] * 2]
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
