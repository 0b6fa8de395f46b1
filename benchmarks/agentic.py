"""Agentic RL: GRPO generation through the engine, episodes through the warm pool, time on sandboxes.

Sections (each ratio is against a baseline measured in the same run, same model, same batch):
1. GRPO step time at G=8 (one prompt x 8 samples per step, single process, fp32, CPU): generation
   through the embedded engine (``grpo.generation: engine``: the group's prompt prefilled once, the
   8 samples decoded as one batch, weights synced from the policy every step) vs TRL's own
   in-process ``generate``. Steps after the first (warm-up, and the engine's build) are timed.
2. Episodes per second through the warm pool at 1, 4 and 16 concurrent ``file_tasks`` episodes
   (the scripted reference policy: several sandboxed shell commands and file writes per episode,
   then the end-state check), a pool of as many boxes; baseline: 1 at a time.
3. Share of a multi-turn GRPO step spent waiting on sandboxes: ``file_tasks`` episodes of the
   reference turns (the model still samples each turn, then the scripted turn is played, as in
   ``tests/integration/multiturn_worker.py``), time inside environment calls (box acquire, start
   files, commands, end-state read-out) over the step's wall time.
4. A long episode: 500 turns through one sandbox session (``--long-turns``), turn latency and the
   verifier's memory at turns 10, 100 and 500; baseline: the session recording every step whole,
   as episodes did before (a turn in five prints 900 KB). The same episode through a sandbox pod on the
   stand-in cluster (``tests/k8s_standin``; the Kubernetes sandbox backend). Then 8 episodes of 200 turns
   side by side, as one GRPO step's rollout runs them: sessions and turns per second against one alone.
   ``--only long`` runs just this section.

The model is random (``init_tiny``, ``--hidden``/``--layers`` to scale it): speeds are real, the
text is noise. The machine is shared (2 cores): run it alone. Run:
.venv/bin/python benchmarks/agentic.py [--quick] [--only long]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROWS: list[tuple[str, str, str, str]] = []


def row(section: str, what: str, value: str, ratio: str) -> None:
    ROWS.append((section, what, value, ratio))
    print(f"  {section} | {what} | {value} | {ratio}", flush=True)


def grpo_trainer(model_dir: str, rows: list[dict], domains, out: str, steps: int, rollout, completion: int,
                 reward_funcs=None):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from temper.training.rewards import DomainRewards

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    args = GRPOConfig(output_dir=out, per_device_train_batch_size=8, num_generations=8, max_steps=steps,
                      max_completion_length=completion, temperature=1.0, learning_rate=1e-3, beta=0.0, report_to=[],
                      use_cpu=True, bf16=False, shuffle_dataset=False, logging_steps=1, save_strategy="no",
                      disable_tqdm=True, seed=0)
    times = StepTimes()
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                          reward_funcs=reward_funcs or [DomainRewards(domains)], args=args,
                          train_dataset=Dataset.from_list(rows),
                          processing_class=AutoTokenizer.from_pretrained(model_dir),
                          rollout_func=rollout, callbacks=[times])
    return trainer, times


def rows_of(domain, n: int, seed: int = 0) -> list[dict]:
    from temper.data.generators import generate

    return [{"prompt": domain.render_prompt(r), "domain": domain.name, "record": json.dumps(r)}
            for r in generate(domain.dataset.generator, n, seed, 0.1, {}).to_dict("records")]


PREAMBLE = ("You are a careful calculator. Read the question, work it out digit by digit, check the carry, "
            "and answer with the number only. ") * 8  # ~800 characters = ~800 tokens of the char tokenizer


def bench_step_time(model_dir: str, steps: int, completion: int, tmp: str) -> None:
    from temper.data.catalog import load_catalog
    from temper.training.multiturn import MultiTurnRollout

    domain = load_catalog(REPO / "domains")["arithmetic"]
    for prompts in ("short", "long"):
        rows = rows_of(domain, steps)
        if prompts == "long":  # a long shared prompt: what the engine's one prefill per group saves
            rows = [{**r, "prompt": PREAMBLE + r["prompt"]} for r in rows]
        results = {}
        for name in ("trainer", "engine"):
            rollout = MultiTurnRollout([domain], rows, engine=True) if name == "engine" else None
            trainer, times = grpo_trainer(model_dir, rows, [domain], f"{tmp}/{prompts}-{name}", steps, rollout,
                                          completion)
            trainer.train()
            results[name] = statistics.mean(times.times[1:])
            extra = ""
            if rollout is not None:
                s = rollout.engine.stats()
                extra = f" (weight sync {s['sync_s'] / s['syncs'] * 1000:.0f} ms/step)"
            length = len(trainer.processing_class(rows[0]["prompt"])["input_ids"])
            row("1. GRPO step, G=8", f"{prompts} prompt ({length} tokens), generation: {name}",
                f"{results[name]:.2f} s/step{extra}",
                "baseline" if name == "trainer" else f"{results['trainer'] / results[name]:.2f}x faster")


def file_records(n: int) -> list[dict]:
    from temper.data.generators import generate

    return generate("file_tasks", n, 0, 0.1, {}).to_dict("records")


def bench_pool(concurrencies: list[int], episodes: int) -> None:
    from infra.sandbox import SandboxPool
    from temper.agent.environment import play
    from temper.agent.kinds import make_environment
    from temper.data.catalog import load_catalog
    from temper.verifiers.families.episode import episode_limits

    params = load_catalog(REPO / "domains")["file_tasks"].verifier.params
    records = file_records(episodes)
    base = None
    for c in concurrencies:
        pool = SandboxPool("shell", size=c, spare=0)
        try:
            def one(record):
                env = make_environment("files", episode_limits(params), pool=pool)
                try:
                    return play(env, record, json.loads(record["reference"]))
                finally:
                    env.close()

            one(records[0])  # warm
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=c) as ex:
                rewards = list(ex.map(one, records))
            wall = time.perf_counter() - t0
        finally:
            pool.close()
        rate = episodes / wall
        base = base or rate
        turns = statistics.mean(len(json.loads(r["reference"])) for r in records)
        row("2. warm pool", f"{c} concurrent episodes ({turns:.1f} turns each)",
            f"{rate:.1f} episodes/s (solved {sum(rewards)}/{len(rewards)})",
            "baseline" if c == concurrencies[0] else f"{rate / base:.2f}x")


def long_turn(i: int) -> str:
    """Turn ``i`` of section 4's scripted episode: shell turns, file writes, 900 KB of output every fifth."""
    if i % 5 == 4:
        return "<bash>head -c 900000 /dev/zero | tr '\\0' y</bash>"
    return f"<bash>echo {i} >> log.txt; tail -1 log.txt</bash>" if i % 2 else f'<write path="f{i % 9}">{i}</write>'


def _latency_at(took: list[float], i: int) -> float:
    """Median ms of the shell turns (a write is a host-side file write, ~0 ms) among the 20 before turn ``i``."""
    return statistics.median(t for j, t in enumerate(took[max(0, i - 20):i], max(1, i - 19))
                             if j % 2 and j % 5 != 4) * 1e3


def bench_long_episode(turns: int, marks: tuple[int, ...] = (10, 100, 500)) -> None:
    """One ``turns``-turn files episode through one session: turn latency (median of the shell turns among
    the last 20 at each mark) and the verifier's RSS at each mark; a turn in five prints 900 KB (under the cap).
    Baseline: the same episode with the session recording every step, as episodes did before."""
    import psutil

    from infra.sandbox import SandboxPool, Session
    from temper.agent.environment import EpisodeLimits
    from temper.agent.files import FilesEnvironment

    class Recording(FilesEnvironment):  # the old behaviour: every step kept whole in session.steps
        def _start(self, record):
            text = super()._start(record)
            self.session = Session(self.session.box, self.session.limits)
            return text

    me = psutil.Process()
    marks = tuple(m for m in marks if m <= turns)
    with SandboxPool("shell", size=1) as pool:
        # now first: the baseline's recorded steps, once freed, would lower the RSS the other run starts from
        for label, cls in (("episode session (now)", FilesEnvironment),
                           ("session recording every step (before)", Recording)):
            env = cls(EpisodeLimits(max_turns=turns + 1, budget_s=3600, step_timeout_s=10), pool=pool)
            env.reset(instruction="", start_files="{}")
            rss0, took, seen = me.memory_info().rss, [], {}
            for i in range(1, turns + 1):
                t0 = time.perf_counter()
                env.step(long_turn(i))
                took.append(time.perf_counter() - t0)
                if i in marks:
                    seen[i] = (_latency_at(took, i), (me.memory_info().rss - rss0) / 2**20)
            env.close()
            first = seen[marks[0]][0]
            for m in marks:
                row("4. long episode", f"{label}: turn {m}",
                    f"{seen[m][0]:.0f} ms/turn, verifier RSS {seen[m][1]:+.0f} MB",
                    f"{seen[m][0] / first:.2f}x turn {marks[0]}'s latency")


def bench_long_episode_standin(turns: int, marks: tuple[int, ...] = (10, 100, 500)) -> None:
    """Section 4's episode through a sandbox pod on the stand-in cluster (``KubernetesBackend``: one pod, an
    exec per turn; the stand-in is ``tests/k8s_standin``, its pods bubblewrap boxes on this machine): turn
    latency, the verifier's RSS and open file descriptors at each mark (the stand-in's API server runs in
    this process, so its accepted sockets are counted too)."""
    import psutil

    from infra.k8s.api import ClusterApi
    from infra.k8s.options import KubernetesOptions
    from infra.sandbox import SandboxPool
    from infra.sandbox.kubernetes import KubernetesBackend
    from temper.agent.environment import EpisodeLimits
    from temper.agent.files import FilesEnvironment
    from tests.k8s_standin.cluster import StandinCluster, workload_image

    me = psutil.Process()
    marks = tuple(m for m in marks if m <= turns)
    with tempfile.TemporaryDirectory() as tmp:
        image = workload_image(REPO, Path(sys.executable).parent.parent)
        cluster = StandinCluster(Path(tmp) / "k8s-standin", {"temper-workload:latest": image})
        try:
            cluster.create_namespace("temper", service_accounts=())
            opts = KubernetesOptions(namespace="temper", priority_class=None, sandbox_priority_class=None,
                                     s3_secret=None, poll_interval_s=0.2, sandbox_start_timeout_s=60,
                                     sandbox_lifetime_s=3600)
            backend = KubernetesBackend(ClusterApi(cluster.api_client), opts, poll_s=0.1)
            with SandboxPool("shell", size=1, spare=0, backend=backend) as pool:
                env = FilesEnvironment(EpisodeLimits(max_turns=turns + 1, budget_s=3600, step_timeout_s=30),
                                       pool=pool)
                env.reset(instruction="", start_files="{}")
                rss0, fds0, took, seen = me.memory_info().rss, me.num_fds(), [], {}
                for i in range(1, turns + 1):
                    t0 = time.perf_counter()
                    env.step(long_turn(i))
                    took.append(time.perf_counter() - t0)
                    if i in marks:
                        seen[i] = (_latency_at(took, i), (me.memory_info().rss - rss0) / 2**20, me.num_fds() - fds0)
                assert env.outcome == "running", (env.outcome, env.trajectory[-1])
                env.close()
        finally:
            cluster.stop()
    assert not cluster.errors, cluster.errors
    first = seen[marks[0]][0]
    for m in marks:
        row("4. long episode", f"stand-in sandbox pod: turn {m}",
            f"{seen[m][0]:.0f} ms/turn, verifier RSS {seen[m][1]:+.0f} MB, fds {seen[m][2]:+d}",
            f"{seen[m][0] / first:.2f}x turn {marks[0]}'s latency")


def bench_long_group(turns: int, groups: tuple[int, ...] = (1, 8)) -> None:
    """Long episodes side by side, as one GRPO step's rollout runs them: ``g`` episodes of ``turns`` scripted
    turns each, one box per episode, every round of turns in threads (as ``MultiTurnRollout`` steps them);
    sessions and turns per second against one episode alone."""
    from concurrent.futures import ThreadPoolExecutor

    from infra.sandbox import SandboxPool
    from temper.agent.environment import EpisodeLimits
    from temper.agent.files import FilesEnvironment

    base = None
    for g in groups:
        with SandboxPool("shell", size=g, spare=0) as pool:
            envs = [FilesEnvironment(EpisodeLimits(max_turns=turns, budget_s=3600, step_timeout_s=10), pool=pool)
                    for _ in range(g)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=g) as ex:
                list(ex.map(lambda e: e.reset(instruction="", start_files="{}"), envs))
                for i in range(turns):
                    text = (f"<bash>echo {i} >> log.txt; wc -l < log.txt</bash>" if i % 2
                            else f'<write path="f{i % 9}">{i}</write>')
                    list(ex.map(lambda e: e.step(text), envs))
                list(ex.map(lambda e: e.close(), envs))
            wall = time.perf_counter() - t0
        assert all(e.turns == turns for e in envs)
        rate = g / wall
        base = base or rate
        row("4. long episode", f"{g} episodes of {turns} turns side by side (one GRPO step's rollout)",
            f"{rate:.2f} sessions/s, {g * turns / wall:.0f} turns/s",
            "baseline" if g == groups[0] else f"{rate / base:.2f}x")


def bench_sandbox_share(model_dir: str, steps: int, tmp: str, engine: bool) -> None:
    from temper.data.catalog import load_catalog
    from temper.training.multiturn import MultiTurnRollout, episode_reward

    domain = load_catalog(REPO / "domains")["file_tasks"]
    rows = rows_of(domain, steps)

    class Timed(MultiTurnRollout):
        """The model samples each turn (real cost), then the record's reference turn is played; time
        spent inside environment calls (all of them go through ``_each``) is summed."""

        waited = 0.0

        def _each(self, fn, items):
            t0 = time.perf_counter()
            try:
                return super()._each(fn, items)
            finally:
                Timed.waited += time.perf_counter() - t0

        def _generate(self, model, trainer, tokenizer, active, max_new, eos):
            super()._generate(model, trainer, tokenizer, active, min(max_new, 32), eos)
            out = []
            for ep in active:
                turns = json.loads(ep["env"].record["reference"])
                text = turns[ep["env"].turns] if ep["env"].turns < len(turns) else "<done/>"
                ids = tokenizer(text, add_special_tokens=False)["input_ids"][: max_new - 1]
                out.append(ids + [tokenizer.eos_token_id])
                ep.pop("turn_logprobs", None)
            return out

    rollout = Timed([domain], rows, max_turn_tokens=200, engine=engine)
    name = "engine" if engine else "trainer"
    trainer, times = grpo_trainer(model_dir, rows, [domain], f"{tmp}/share-{name}", steps, rollout, 1024,
                                  reward_funcs=[episode_reward])
    marks = []
    orig = rollout.__class__.__call__

    def call(self, prompts, tr):
        before = Timed.waited
        t0 = time.perf_counter()
        out = orig(self, prompts, tr)
        marks.append((Timed.waited - before, time.perf_counter() - t0))
        return out

    rollout.__class__.__call__ = call
    try:
        trainer.train()
    finally:
        if getattr(rollout, "_pool", None) is not None:
            rollout._pool.close()
    waited = sum(w for w, _ in marks[1:])
    step = sum(times.times[1:])
    turns = statistics.mean(e["turns"] for e in rollout.last_episodes)
    row("3. sandbox share", f"file_tasks step, G=8, {turns:.1f} turns/episode, generation: {name}",
        f"{step / max(1, len(times.times) - 1):.2f} s/step, {waited / max(1, len(marks) - 1):.2f} s on sandboxes",
        f"{100 * waited / step:.0f}% of step time")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer steps and episodes")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--completion", type=int, default=48, help="max_completion_length of section 1")
    parser.add_argument("--long-turns", type=int, default=500, help="turns of section 4's episode")
    parser.add_argument("--only", choices=["long"], help="run only this section")
    args = parser.parse_args()
    from temper.training.tiny import init_tiny

    steps = 3 if args.quick else 6
    if args.only == "long":
        bench_long_episode(args.long_turns)
        bench_long_episode_standin(args.long_turns)
        bench_long_group(200)
        return _table()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(init_tiny(Path(tmp) / "model", hidden=args.hidden, layers=args.layers, max_positions=2048))
        print(f"model: tiny Llama hidden={args.hidden} layers={args.layers}; {steps} GRPO steps per variant "
              "(first untimed)\n")
        bench_step_time(model_dir, steps, args.completion, tmp)
        bench_pool([1, 4, 16], 16 if args.quick else 48)
        bench_sandbox_share(model_dir, steps, tmp, engine=False)
        bench_sandbox_share(model_dir, steps, tmp, engine=True)
    bench_long_episode(args.long_turns)
    bench_long_episode_standin(args.long_turns)
    bench_long_group(200)
    _table()


def _table() -> None:
    print("\n| section | what | measured | vs baseline |\n|---|---|---|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
