"""Orchestration overhead of the validate + eval fan-out: 10/100/300 generated tiny domains.

For each N, N tiny domains (copies of domains/arithmetic.yaml with distinct names, 20 rows,
datasets written by ``temper.data.generators.generate_domain_dataset``, guarded by the shipped
arithmetic contract) go into their own temp catalog, under a temp TEMPER_HOME. Each fan-out is
timed twice in the same run, on the same data:

* direct: the plain function the task wraps, called in a plain Python loop (the baseline);
* Prefect: a flow that maps the task over the N domains against a real Prefect API
  (``prefect_test_harness``: a temporary server subprocess with its own sqlite DB), with the
  default task runner the real flows use (flows/validate_data.py and flows/post_training.py set
  none, so it is Prefect's ThreadPoolTaskRunner; its default max_workers is unbounded).

Fan-outs:
1. validate: ``tasks.data.validate_domain`` itself (cache key by digest, persisted result), real GX
   contracts; direct = ``validate_domain.fn`` in a loop. Then the same flow again: every task hits
   the digest cache (the "re-run after fixing one domain" path of validate_data).
2. eval-style: a task shaped like ``tasks.evaluation.evaluate`` (same decorator options, same
   arguments, mapped with ``unmapped`` like post_training) whose body is cheap: the domain's eval
   split scored by its verifier with fixed completions (the references), no model and no eval
   process (a real eval job per domain would measure process start, not orchestration).
3. no-op: a task that returns its argument; the floor of Prefect's per-task cost.

Each Prefect fan-out runs twice: with the task runner the real flows get (none given: Prefect's
ThreadPoolTaskRunner with unbounded max_workers, i.e. one thread per mapped task at once) and with
ThreadPoolTaskRunner(max_workers=1), which uses the CPU like the serial direct loop, so "serial
runner - direct" is the orchestration overhead alone and "default runner - direct" is what the
flows pay (overhead plus whatever N concurrent threads win or lose on 2 cores).

overhead/task = (Prefect wall - direct wall) / N, one flow run's fixed cost (~1 s: flow-run
creation and the heartbeat thread's join at exit) included, so it falls with N when the per-task
cost is constant; growth = overhead/task at N over at the first N; marginal = overhead added per
extra task since the previous N (the first N: since an empty flow run), constant when linear.
Peak RSS / threads: of this process during the Prefect call (sampled every 50 ms).

Run: .venv/bin/python benchmarks/fanout.py [--sizes 10,100,300] [--quick] 2>fanout.log
(Prefect's task-run logs go to stderr; the tables go to stdout.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ROWS = 20  # per domain; 10% eval -> 2 eval records, >= the contract's min_rows of 10
CATALOG: dict = {}  # domain name -> Domain, loaded once per size (the eval-style body reads it)


def passing_seed(base: dict, start: int) -> int:
    """First seed >= start whose ROWS-row dataset meets the contract's eval share (0.05-0.2): with
    20 random splits a seed can draw 5 eval rows, and the benchmark times passing validations."""
    from temper.data.generators import generate

    ds = base["dataset"]
    for seed in range(start, start + 1000):
        frame = generate(ds["generator"], ROWS, seed, base["split"]["eval_fraction"], ds["generator_params"])
        if 0.05 <= (frame["split"] == "eval").mean() <= 0.2:
            return seed
    raise RuntimeError("no passing seed")


def make_catalog(root: Path, n: int, tag: str = "") -> Path:
    import yaml

    base = yaml.safe_load((REPO / "domains" / "arithmetic.yaml").read_text())
    cat = root / f"catalog-{n}{tag}"
    cat.mkdir()
    for i in range(n):
        name = f"n{n}{tag}_{i:03d}"  # distinct per size: the validation cache key starts with the name
        d = {**base, "name": name, "description": f"generated tiny domain {i} of {n}",
             "dataset": {**base["dataset"], "uri": f"{{store}}/bench/{name}.jsonl", "rows": ROWS, "seed": passing_seed(base, i * 1000)}}
        (cat / f"{name}.yaml").write_text(yaml.safe_dump(d))
    return cat


# -- the eval-style body: workloads/evaluate.py's evaluate_domain without the model ----------------
def score_domain(model_dir: str, domain_name: str, settings) -> dict:
    """The domain's eval split scored by its verifier, completions fixed to the references."""
    import asyncio

    from temper.data.datasets import load_dataset
    from temper.lifecycle.evaluation import summary
    from temper.core.settings import get_settings
    from temper.verifiers import get_verifier
    from workloads.evaluate import _score_all

    domain = CATALOG[domain_name]
    ds = load_dataset(domain, get_settings())
    frame = ds.frame[ds.frame[domain.split.column] == domain.split.eval].head(settings.limit)
    records = frame.to_dict(orient="records")
    prompts = [domain.render_prompt(r) for r in records]
    completions = [f" {r['reference']}" for r in records]  # fixed: what a perfect model would say
    verifier = get_verifier(domain.verifier.family, domain.verifier.params)
    verdicts = asyncio.run(_score_all(verifier, records, completions))
    rewards = [float(v.reward) for v in verdicts if v is not None]
    assert len(prompts) == len(rewards) > 0
    return summary({"domain": domain.name, "mean_reward": sum(rewards) / len(rewards),
                    "pass_rate": sum(r >= 1.0 for r in rewards) / len(rewards), "n": len(records),
                    "scored": len(rewards)})


def build_flows(serial: bool):
    """The benchmark flows, with the task runner the real flows get (none given: Prefect's default
    ThreadPoolTaskRunner, unbounded) or a serial one (max_workers=1, CPU use like the direct loop)."""
    from prefect import flow, task, unmapped
    from prefect.task_runners import ThreadPoolTaskRunner

    from tasks.data import validate_domain

    kw = {"task_runner": ThreadPoolTaskRunner(max_workers=1)} if serial else {}
    tag = "serial" if serial else "default"

    @task(retries=1, retry_delay_seconds=5, task_run_name="eval-{label}-{domain}")  # as tasks.evaluation.evaluate
    def evaluate_cheap(model_dir: str, domain: str, settings, label: str, parent_run_id: str | None = None) -> dict:
        return score_domain(model_dir, domain, settings)

    @task
    def noop(i: int) -> int:
        return i

    @flow(name=f"bench_empty_{tag}", **kw)
    def empty_flow() -> None:
        return None

    @flow(name=f"bench_validate_fanout_{tag}", **kw)
    def validate_fanout(refs: list, catalog_dir: str) -> list:
        return validate_domain.map(refs).result()

    @flow(name=f"bench_eval_fanout_{tag}", **kw)
    def eval_fanout(domains: list[str], settings) -> list:
        return evaluate_cheap.map(unmapped("fixed-completions"), domains, unmapped(settings),
                                  unmapped("candidate")).result()

    @flow(name=f"bench_noop_fanout_{tag}", **kw)
    def noop_fanout(n: int) -> list:
        return noop.map(list(range(n))).result()

    return empty_flow, validate_fanout, eval_fanout, noop_fanout


class Peak:
    """Peak RSS (MB) and thread count of this process while a block runs (sampled every 50 ms)."""

    def __enter__(self):
        import threading

        import psutil

        self.rss = self.threads = 0
        self._stop = threading.Event()
        me = psutil.Process()

        def poll():
            while not self._stop.wait(0.05):
                self.rss = max(self.rss, me.memory_info().rss)
                self.threads = max(self.threads, me.num_threads())

        self._t = threading.Thread(target=poll, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def _cpu() -> float:
    """CPU seconds of this process (all threads) plus its children (the Prefect server subprocess)."""
    import psutil

    total = time.process_time()
    for c in psutil.Process().children(recursive=True):
        try:
            t = c.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def timed(fn, *args):
    """(wall s, CPU s) of fn(*args), and its result. CPU time is the noise-robust measure here: other
    processes on the machine stretch wall time but not (much) the CPU seconds this work burns."""
    c, t = _cpu(), time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - t, _cpu() - c), out


def median2(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


V_SERIAL, V_DEFAULT, V_CACHED = "validate [serial runner]", "validate [default runner]", "validate cached rerun [default]"
E_SERIAL, E_DEFAULT = "eval-style [serial runner]", "eval-style [default runner]"
N_SERIAL, N_DEFAULT = "no-op [serial runner]", "no-op [default runner]"


def run(sizes: list[int], tmp: Path) -> tuple[dict, dict, float]:
    from prefect.testing.utilities import prefect_test_harness

    from tasks.data import resolve_domains, validate_domain
    from temper.data.catalog import load_catalog
    from temper.data.generators import generate_domain_dataset
    from temper.lifecycle.params import EvalSettings
    from temper.core.settings import get_settings

    get_settings.cache_clear()
    eval_settings = EvalSettings(limit=64)
    results: dict[str, dict[int, tuple]] = {k: {} for k in (V_SERIAL, V_DEFAULT, V_CACHED, E_SERIAL, E_DEFAULT,
                                                             N_SERIAL, N_DEFAULT)}
    extra: dict[int, dict] = {}
    tags = iter(range(10**6))

    def prepare(n: int):
        cat = make_catalog(tmp, n, f"r{next(tags)}")  # fresh names each time: a validate run must miss the cache
        CATALOG.clear()
        CATALOG.update(load_catalog(cat))
        for d in CATALOG.values():
            generate_domain_dataset(d)
        return str(cat), resolve_domains.fn(None, str(cat))

    def direct_validate(refs, cat):
        return [validate_domain.fn(r) for r in refs]

    def direct_eval(names):
        return [score_domain("fixed-completions", n, eval_settings) for n in names]

    with prefect_test_harness(server_startup_timeout=180):
        serial, default = build_flows(serial=True), build_flows(serial=False)
        # warm-up (imports, GX, the server's first requests), not timed
        cat, refs = prepare(2)
        direct_validate(refs, cat), direct_eval(list(CATALOG))
        for empty_flow, validate_fanout, eval_fanout, noop_fanout in (serial, default):
            cat, refs = prepare(2)
            validate_fanout(refs, cat), eval_fanout(list(CATALOG), eval_settings), noop_fanout(2), empty_flow()
        fixed = [timed(f)[0] for f in (serial[0], default[0]) * 2]  # (wall, cpu) of empty flow runs

        for n in sizes:
            def ok_reports(reports):
                assert len(reports) == n and all(r.success for r in reports), [r for r in reports if not r.success][:1]

            def ok_evals(out):
                assert len(out) == n and all(r["mean_reward"] == 1.0 for r in out)

            def med(fn, *a, check=None, reps=3):
                samples = []
                for _ in range(reps):
                    w, out = timed(fn, *a)
                    if check:
                        check(out)
                    samples.append(w)
                return median2(samples)

            reps = 3 if n <= 30 else 1  # the validate fan-outs: median of 3 only where it is cheap
            cat, refs = prepare(n)
            extra[n] = {"catalog_ms": min(timed(load_catalog, cat)[0][1] for _ in range(3)) * 1000}  # CPU
            print(f"N={n}: datasets ready", file=sys.stderr, flush=True)

            d_wall = med(direct_validate, refs, cat, check=ok_reports, reps=reps)
            for key, flows in ((V_SERIAL, serial), (V_DEFAULT, default)):
                walls, peaks = [], []
                for _ in range(reps):
                    cat, refs = prepare(n)
                    with Peak() as pk:
                        w, out = timed(flows[1], refs, cat)
                    ok_reports(out)
                    walls.append(w)
                    peaks.append(pk)
                results[key][n] = (d_wall, median2(walls))
                extra[n][key] = (max(p.rss for p in peaks) / 2**20, max(p.threads for p in peaks))
            with Peak() as pk:  # the last default run's domains again: every task is Cached
                results[V_CACHED][n] = (None, med(default[1], refs, cat, check=ok_reports, reps=reps))
            extra[n][V_CACHED] = (pk.rss / 2**20, pk.threads)
            names = sorted(CATALOG)

            d_wall = med(direct_eval, names, check=ok_evals)
            for key, flows in ((E_SERIAL, serial), (E_DEFAULT, default)):
                with Peak() as pk:
                    results[key][n] = (d_wall, med(flows[2], names, eval_settings, check=ok_evals))
                extra[n][key] = (pk.rss / 2**20, pk.threads)

            d_wall = med(lambda k: [i for i in range(k)], n)
            for key, flows in ((N_SERIAL, serial), (N_DEFAULT, default)):
                with Peak() as pk:
                    results[key][n] = (d_wall, med(flows[3], n, check=lambda out: out == list(range(n))))
                extra[n][key] = (pk.rss / 2**20, pk.threads)
            print(f"N={n}: done " + ", ".join(f"{k}={v[n][1][0]:.2f}s" for k, v in results.items()),
                  file=sys.stderr, flush=True)
        fixed += [timed(f)[0] for f in (serial[0], default[0]) * 2]
    return results, extra, median2(fixed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,100,300", help="comma-separated domain counts (default 10,100,300)")
    ap.add_argument("--quick", action="store_true", help="sizes 10,30")
    args = ap.parse_args()
    sizes = [10, 30] if args.quick else [int(s) for s in args.sizes.split(",") if s.strip()]

    tmp = Path(tempfile.mkdtemp(prefix="temper-fanout-"))
    os.environ.update({
        "TEMPER_HOME": str(tmp / "home"), "TEMPER_CATALOG_DIR": str(tmp / "unused-catalog"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "GX_ANALYTICS_ENABLED": "false",
        "PREFECT_HOME": str(tmp / "prefect-home"), "PREFECT_LOCAL_STORAGE_PATH": str(tmp / "prefect-results"),
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    })
    for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "PREFECT_API_URL", "PREFECT_API_KEY"):
        os.environ.pop(var, None)

    t0 = time.perf_counter()
    results, extra, fixed = run(sizes, tmp)
    print(f"Prefect {__import__('prefect').__version__}, real API (prefect_test_harness); {ROWS} rows per domain; "
          f"one empty flow run = {fixed[0] * 1000:.0f} ms wall, {fixed[1] * 1000:.0f} ms CPU; "
          f"total {time.perf_counter() - t0:.0f} s")
    print("overhead/task = (Prefect - direct) / N, the flow run's fixed cost included; growth = overhead/task at N "
          "over at the first N; marginal = overhead added per extra task since the previous N (first N: since an "
          "empty flow run). CPU = this process + the Prefect server subprocess.\n")
    print("| fan-out | N | wall direct s | wall Prefect s | wall Prefect/direct | CPU direct s | CPU Prefect s | "
          "overhead ms/task wall | overhead ms/task CPU | growth (CPU) | marginal CPU ms/task | peak RSS MB | "
          "peak threads |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, per_n in results.items():
        base, prev = None, (0, fixed[1])
        for n, (d, p) in per_n.items():
            d = d or (0.0, 0.0)
            over_w, over_c = p[0] - d[0], p[1] - d[1]
            base = base if base is not None else over_c / n
            marginal = (over_c - prev[1]) / (n - prev[0])
            prev = (n, over_c)
            rss, threads = extra[n][name]
            ratio = f"{p[0] / d[0]:.2f}x" if d[0] > 0.05 else "-"
            print(f"| {name} | {n} | {d[0]:.2f} | {p[0]:.2f} | {ratio} | {d[1]:.2f} | {p[1]:.2f} | "
                  f"{over_w / n * 1000:.1f} | {over_c / n * 1000:.1f} | {over_c / n / base:.2f}x | "
                  f"{marginal * 1000:.1f} | {rss:.0f} | {threads} |")
    print()
    print("| N | direct validate body, CPU ms/domain | of which load_catalog() of the whole catalog, CPU ms |")
    print("|---:|---:|---:|")
    for n, (d, _) in results[V_SERIAL].items():
        print(f"| {n} | {d[1] / n * 1000:.0f} | {extra[n]['catalog_ms']:.0f} |")
    print()

    n_max = max(sizes)
    vd, ed = results[V_DEFAULT][n_max], results[E_DEFAULT][n_max]
    vs, es = results[V_SERIAL][n_max], results[E_SERIAL][n_max]
    total = vd[1][0] + ed[1][0]
    print(f"goal 'under 60 s at {n_max}', as the flows run (default runner): validate fan-out {vd[1][0]:.1f} s + "
          f"eval-style fan-out {ed[1][0]:.1f} s = {total:.1f} s wall -> {'MET' if total < 60 else 'NOT MET'} "
          f"(the same bodies in a plain loop: {vd[0][0] + ed[0][0]:.1f} s)")
    over_w = (vs[1][0] - vs[0][0]) + (es[1][0] - es[0][0])
    over_c = (vs[1][1] - vs[0][1]) + (es[1][1] - es[0][1])
    print(f"orchestration overhead alone at {n_max} (serial runner - direct, both fan-outs): {over_w:.1f} s wall, "
          f"{over_c:.1f} s CPU -> {'under' if over_w < 60 else 'over'} 60 s")
    for name in results:
        r = results[name]
        ns = sorted(r)
        if len(ns) > 2:  # marginal CPU cost per added task: the largest step vs the step before it
            over = {n: r[n][1][1] - (r[n][0] or (0.0, 0.0))[1] for n in ns}
            lo = (over[ns[-2]] - over[ns[-3]]) / (ns[-2] - ns[-3])
            hi = (over[ns[-1]] - over[ns[-2]]) / (ns[-1] - ns[-2])
            verdict = f"{hi / lo:.2f}x (1.00x = linear)" if lo > 0 else "first step within noise"
            print(f"{name}: marginal CPU overhead per added task {ns[-3]}->{ns[-2]}: {lo * 1000:.1f} ms, "
                  f"{ns[-2]}->{ns[-1]}: {hi * 1000:.1f} ms -> {verdict}")


if __name__ == "__main__":
    main()
