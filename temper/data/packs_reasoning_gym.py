"""The reasoning-gym side of the ``reasoning_gym`` pack: the only temper module that imports it.

``import reasoning_gym`` costs 1.5-2.5 s, so nothing on the catalog path imports this module:
the catalog reads the task index (``temper/data/pack_index/reasoning_gym-<version>.json``, built by
``build_index``) instead, and generation runs here in worker processes with ``PYTHONHASHSEED``
pinned (five tasks' items depend on set/dict iteration order; see ``generate_many``).

A row keeps reasoning-gym's own entry (question, answer, metadata) as JSON in ``entry``, so any
row can be re-scored by ``reasoning_gym.get_score_answer_fn(task)(answer, json.loads(entry))``.
``answer`` is the oracle, or for the tasks that score a proposed solution (entry answer None) the
reference solution the generator itself recorded (``REFERENCE_KEYS``); ``reference`` is the SFT
target ``<answer>...</answer>``.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

#: Tasks whose entry answer is None, and the metadata key where the generator leaves a solution
#: that its own scorer accepts (tested: each scores 1.0 through temper's verifier).
REFERENCE_KEYS = {
    "graph_color": "possible_answer",
    "propositional_logic": "example_answer",
    "rubiks_cube": "example_correct_answer",
}
#: Tiers are curriculum global levels (create_curriculum(task).set_global_level(level)).
TIER_LEVELS = {"easy": 0, "medium": 1, "hard": 2, "expert": 3}
HASH_SEED = "0"


def _version() -> str:
    return version("reasoning-gym")


def tier_config(task: str, tier: str, rows: int, seed: int):
    """reasoning-gym's config of ``task`` at ``tier`` ('default' = the task's own defaults)."""
    # lazy: reasoning_gym (1.4 s) only for the runs of `-m temper.data.packs_reasoning_gym` that need it
    from reasoning_gym.factory import CURRICULA, DATASETS

    _, config_cls = DATASETS[task]
    if tier == "default":
        return config_cls(seed=seed, size=rows)
    curriculum = CURRICULA[task]()
    curriculum.set_global_level(TIER_LEVELS[tier])
    return curriculum.generate_configuration({"seed": seed, "size": rows})


def _answer(task: str, entry: dict[str, Any]) -> str:
    if entry["answer"] is not None:
        return str(entry["answer"])
    ref = entry["metadata"].get(REFERENCE_KEYS.get(task, ""), "")
    return ref if isinstance(ref, str) else json.dumps(ref, sort_keys=True)


def generate_rows(domain: str, task: str, tier: str, rows: int, seed: int, eval_fraction: float) -> bytes:
    """The domain's dataset as JSONL bytes (sorted keys, one row a line): same inputs, same bytes."""
    # lazy: reasoning_gym (1.4 s) only for the runs of `-m temper.data.packs_reasoning_gym` that need it
    from reasoning_gym.factory import DATASETS

    config = tier_config(task, tier, rows, seed)
    if hasattr(config, "validate"):
        config.validate()
    ds = DATASETS[task][0](config=config)
    n_eval = max(1, round(rows * eval_fraction))
    eval_idx = set(random.Random(f"{domain}:{seed}:split").sample(range(rows), n_eval))
    lines = []
    for i in range(rows):
        entry = ds[i]
        answer = _answer(task, entry)
        row = {"id": f"{domain}-{i:05d}", "task": task, "tier": tier, "question": entry["question"],
               "answer": answer, "reference": f"<answer>{answer}</answer>",
               "entry": json.dumps(entry, sort_keys=True), "split": "eval" if i in eval_idx else "train"}
        lines.append(json.dumps(row, sort_keys=True) + "\n")
    return "".join(lines).encode()


def _worker() -> None:
    """Worker process: jobs as JSON lines on stdin, one result line per job on stdout.

    A job is {domain, task, tier, rows, seed, eval_fraction, out}; the worker writes the bytes to
    ``out`` (a private temp file of the parent) and answers {domain, ok, seconds, error}.
    """
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # some generators print to stdout: keep it out of the reply channel
    sys.stdout = sys.stderr
    # lazy: reasoning_gym (1.4 s) only for the runs of `-m temper.data.packs_reasoning_gym` that need it
    import reasoning_gym  # noqa: F401 - once per worker, not per job

    for line in sys.stdin:
        job = json.loads(line)
        start = time.perf_counter()
        try:
            data = generate_rows(job["domain"], job["task"], job["tier"], job["rows"], job["seed"],
                                 job["eval_fraction"])
            with open(job["out"], "wb") as f:
                f.write(data)
            reply = {"domain": job["domain"], "ok": True}
        except Exception as e:  # reported per domain: the others still generate
            reply = {"domain": job["domain"], "ok": False, "error": f"{type(e).__name__}: {e}"}
        reply["seconds"] = round(time.perf_counter() - start, 3)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def generate_many(jobs: list[dict[str, Any]], processes: int = 2,
                  on_reply: Callable[[dict[str, Any]], None] | None = None) -> dict[str, dict[str, Any]]:
    """Run jobs over ``processes`` workers, each a fresh interpreter with PYTHONHASHSEED pinned.

    The hash seed must be fixed before the interpreter starts (set iteration order in
    isomorphic_strings, knight_swap, polynomial_multiplication, ransom_note, word_ladder), so the
    workers are subprocesses, not forks of this one. Jobs are dealt longest-first (by rows x tier)
    to the worker that is free; returns domain -> reply. ``on_reply`` sees each reply as it comes
    (the caller checks and stores a domain while the others still generate).
    """
    env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), *sys.path]))
    procs = [subprocess.Popen([sys.executable, "-c", "from temper.data.packs_reasoning_gym import _worker; _worker()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env)
             for _ in range(max(1, min(processes, len(jobs))))]
    queue = sorted(jobs, key=lambda j: (-j["rows"] * (1 + TIER_LEVELS.get(j["tier"], 0)), j["domain"]))
    replies: dict[str, dict[str, Any]] = {}
    try:
        busy = {}

        sel = selectors.DefaultSelector()
        for p in procs:
            sel.register(p.stdout, selectors.EVENT_READ, p)
            if queue:
                job = queue.pop(0)
                p.stdin.write(json.dumps(job) + "\n")
                p.stdin.flush()
                busy[p.pid] = job
        while busy:
            for key, _ in sel.select():
                p = key.data
                line = p.stdout.readline()
                job = busy.pop(p.pid)
                if not line:  # the worker died (a crash in native code): report and stop using it
                    replies[job["domain"]] = {"domain": job["domain"], "ok": False,
                                              "error": f"generation worker exited with {p.wait()}"}
                    if on_reply is not None:
                        on_reply(replies[job["domain"]])
                    sel.unregister(p.stdout)
                    continue
                replies[job["domain"]] = json.loads(line)
                if on_reply is not None:
                    on_reply(replies[job["domain"]])
                if queue:
                    nxt = queue.pop(0)
                    p.stdin.write(json.dumps(nxt) + "\n")
                    p.stdin.flush()
                    busy[p.pid] = nxt
            if not busy and queue and any(p.poll() is None for p in procs):
                continue
        for job in queue:  # every worker died
            replies[job["domain"]] = {"domain": job["domain"], "ok": False, "error": "no generation worker left"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
                p.wait(timeout=30)
    return replies


def build_index() -> dict[str, Any]:
    """What the catalog needs to know about the installed reasoning-gym, without importing it then.

    Per task: the tiers that exist (a curriculum level L exists when some attribute has more than
    L levels and the configuration it gives is accepted), whether entries carry an oracle answer,
    and the config of each tier (for people reading the pack).
    """
    # lazy: reasoning_gym (1.4 s) only for the runs of `-m temper.data.packs_reasoning_gym` that need it
    from reasoning_gym.factory import CURRICULA, DATASETS

    tasks = {}
    for task in sorted(DATASETS):
        if task == "composite":
            continue
        tiers: dict[str, Any] = {}
        if task in CURRICULA:
            depth = max((len(a.levels) for a in CURRICULA[task]().attributes.values()), default=1)
            for tier, level in TIER_LEVELS.items():
                if level >= depth:
                    break
                try:
                    cfg = tier_config(task, tier, 10, 0)
                    if hasattr(cfg, "validate"):
                        cfg.validate()
                except Exception as e:  # a level the task's own config rejects is not a tier
                    tiers[tier] = {"error": f"{type(e).__name__}: {e}"}
                    continue
                tiers[tier] = {k: v for k, v in sorted(vars(cfg).items()) if k not in ("seed", "size")}
        else:
            tiers["default"] = {}
        usable = {k: v for k, v in tiers.items() if "error" not in v}
        oracle = None
        if usable:
            first = DATASETS[task][0](config=tier_config(task, next(iter(usable)), 1, 0))[0]
            oracle = first["answer"] is not None
        tasks[task] = {"tiers": usable, "oracle": oracle,
                       "rejected_tiers": {k: v["error"] for k, v in tiers.items() if "error" in v}}
    return {"source": "reasoning_gym", "version": _version(), "tasks": tasks}


if __name__ == "__main__":  # python -m temper.data.packs_reasoning_gym temper/data/pack_index/reasoning_gym-X.json
    index = build_index()  # some generators print to stdout, so the index goes to a file
    with open(sys.argv[1], "w") as out:
        json.dump(index, out, indent=1, sort_keys=True, default=repr)
        out.write("\n")
