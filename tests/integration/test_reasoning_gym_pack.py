"""The reasoning-gym pack end to end: generation (deterministic, checked before writing), and scoring
through the real sandbox pool with each task's own scorer (oracle 1, perturbed < 1, equal to
reasoning-gym's score_answer, hedging and hostile answers)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from temper.data.catalog import load_catalog
from temper.verifiers import get_verifier

REPO = Path(__file__).resolve().parents[2]
PACK = yaml.safe_load((REPO / "domains" / "packs" / "reasoning_gym.yaml").read_text())
pytestmark = pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="needs bubblewrap")


def gen(jobs, tmp: Path, hash_seed: str | None = None) -> dict[str, bytes]:
    """generate_many from a parent interpreter started with the given PYTHONHASHSEED."""
    for j in jobs:
        j["out"] = str(tmp / f"{j['domain']}.jsonl")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = hash_seed
    code = ("import json, sys; from temper.data.packs_reasoning_gym import generate_many; "
            "print(json.dumps(generate_many(json.loads(sys.argv[1]), processes=2)))")
    replies = json.loads(subprocess.run([sys.executable, "-c", code, json.dumps(jobs)], cwd=REPO, env=env,
                                        capture_output=True, text=True, check=True).stdout)
    assert all(r["ok"] for r in replies.values()), replies
    return {j["domain"]: Path(j["out"]).read_bytes() for j in jobs}


@pytest.fixture(scope="module")
def one_row_per_task(tmp_path_factory):
    """Two rows of every task the pack keeps, at its easiest tier in the shipped catalog."""
    catalog = load_catalog(REPO / "domains")
    easiest: dict[str, object] = {}
    for d in sorted(catalog.values(), key=lambda d: d.name):
        if d._pack == "rg":
            task, tier = d.dataset.generator_params["task"], d.dataset.generator_params["tier"]
            order = ["default", "easy", "medium", "hard", "expert"]
            if task not in easiest or order.index(tier) < order.index(easiest[task][1]):
                easiest[task] = (d, tier)
    jobs = [{"domain": d.name, "task": task, "tier": tier, "rows": 2, "seed": 0, "eval_fraction": 0.5}
            for task, (d, tier) in sorted(easiest.items())]
    data = gen(jobs, tmp_path_factory.mktemp("rows"))
    return {name: [json.loads(line) for line in blob.decode().splitlines()] for name, blob in data.items()}


def score_all(verifier, pairs):
    async def run():
        return await asyncio.gather(*(verifier.ascore(r, c) for r, c in pairs))
    return asyncio.run(run())


def perturb(answer: str) -> str:
    """A wrong answer: booleans flipped, otherwise reversed with junk around (palindromes: doubled)."""
    flips = {"True": "False", "False": "True", "Yes": "No", "No": "Yes"}
    if answer in flips:
        return flips[answer]
    return "9" + (answer[::-1] if answer[::-1] != answer else answer + " " + answer) + "#"


def test_oracle_scores_1_perturbed_below_1_and_rewards_equal_reasoning_gym(one_row_per_task):
    """Every kept task: oracle (or the generator's reference solution) 1.0 through temper's verifier and the
    sandbox pool; a perturbed answer < 1; both equal reasoning-gym's own score_answer on the stored entry."""
    from reasoning_gym.factory import get_score_answer_fn

    verifier = get_verifier("reasoning_gym", PACK["verifier"]["params"])
    rows = [r for rs in one_row_per_task.values() for r in rs]
    assert len({r["task"] for r in rows}) >= 90
    pairs = [(r, f"Some reasoning.\n<answer>{a}</answer>") for r in rows for a in (r["answer"], perturb(r["answer"]))]
    verdicts = score_all(verifier, pairs)
    bad_oracle, bad_perturbed, unequal = [], [], []
    for (r, completion), v in zip(pairs, verdicts):
        oracle = completion.endswith(f"<answer>{r['answer']}</answer>")
        try:  # a scorer that raises on an answer (prime_factorization on "2#") pays 0 in temper
            expected = get_score_answer_fn(r["task"])(completion.split("<answer>")[1][:-len("</answer>")].strip(),
                                                      json.loads(r["entry"]))
        except Exception:
            expected = 0.0
        if v is None or abs(v.reward - expected) > 1e-9:
            unequal.append((r["id"], None if v is None else v.reward, expected))
        elif oracle and v.reward != 1.0:
            bad_oracle.append((r["id"], v.reward, v.details))
        elif not oracle and v.reward >= 1.0:
            bad_perturbed.append((r["id"], r["answer"][:40]))
    assert not unequal, unequal
    assert not bad_oracle, bad_oracle
    assert not bad_perturbed, bad_perturbed


def test_hedging_empty_echoed_and_huge_answers(one_row_per_task):
    """Listing many candidates pays < 0.05 (only the last tag counts, and a substring pays len ratio)."""
    verifier = get_verifier("reasoning_gym", PACK["verifier"]["params"])
    row = one_row_per_task["rg-leg_counting-easy"][0]
    oracle = row["answer"]
    candidates = " ".join(str(i) for i in range(int(oracle) + 60))
    assert oracle in candidates.split()
    prompt = load_catalog(REPO / "domains")["rg-leg_counting-easy"].render_prompt(row)
    cases = {
        "many candidates in one tag": f"<answer>{candidates}</answer>",
        "one tag per candidate, oracle first": "".join(f"<answer>{c}</answer>" for c in [oracle, "0", "0"]),
        "empty": "", "empty tag": "<answer></answer>", "echoed prompt": prompt,
        "huge": f"<answer>{oracle + ' ' * 5000 + oracle}</answer>",
    }
    verdicts = dict(zip(cases, score_all(verifier, [(row, c) for c in cases.values()])))
    assert verdicts["many candidates in one tag"].reward < 0.05
    assert verdicts["one tag per candidate, oracle first"].reward < 0.05
    for name in ("empty", "empty tag", "echoed prompt", "huge"):
        assert verdicts[name].reward == 0.0, (name, verdicts[name])


def test_hostile_answer_to_an_eval_scorer_cannot_touch_the_host(one_row_per_task, tmp_path):
    """string_insertion eval()s the answer (a list of characters equal to the oracle pays 0.1). The payloads
    evaluate to the oracle's characters only if they could read /etc/shadow, write outside the sandbox or
    reach the network; they score 0 and the host file never appears."""
    verifier = get_verifier("reasoning_gym", PACK["verifier"]["params"])
    row = one_row_per_task["rg-string_insertion-easy"][0]
    marker = tmp_path / "pwned"
    win = f"list({row['answer']!r})"
    payloads = [
        f"({win} if len(open('/etc/shadow').read()) >= 0 else [])",
        f"({win} if open({str(marker)!r}, 'w').write('x') else [])",
        f"({win} if __import__('os').system('touch {marker}') == 0 and __import__('os').path.exists({str(marker)!r}) else [])",
        f"({win} if __import__('socket').create_connection(('1.1.1.1', 53), 2) else [])",
    ]
    verdicts = score_all(verifier, [(row, f"<answer>{p}</answer>") for p in payloads])
    assert [v.reward for v in verdicts] == [0.0] * len(payloads), [v.details for v in verdicts]
    assert not marker.exists()
    assert Path("/etc/shadow").exists()  # the payload had something to find on the host
    ok = score_all(verifier, [(row, f"<answer>{win}</answer>")])[0]
    assert ok.reward == 0.1  # the same eval path pays when the expression is honest


def test_generated_bytes_do_not_depend_on_the_hash_seed(tmp_path):
    """The five tasks that follow set order at 0.1.25, generated from parents with different hash seeds."""
    tasks = ["isomorphic_strings", "polynomial_multiplication", "ransom_note", "word_ladder", "leg_counting"]
    jobs = lambda: [{"domain": f"rg-{t}-easy", "task": t, "tier": "easy", "rows": 12, "seed": 3, "eval_fraction": 0.25}
                    for t in tasks]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = gen(jobs(), tmp_path / "a", "1"), gen(jobs(), tmp_path / "b", "977")
    assert a == b
    assert all(len(v.splitlines()) == 12 for v in a.values())


def test_generate_checks_contract_before_writing_and_caches(tmp_path, monkeypatch):
    """A domain whose generated data fails its contract template: error naming pack file, task and column,
    nothing of it in the store; the other domain is written; a second run keeps (cache by spec)."""
    from temper.core.settings import get_settings

    contracts = tmp_path / "contracts"
    (contracts / "templates").mkdir(parents=True)
    tpl = yaml.safe_load((REPO / "data_contracts" / "templates" / "reasoning_gym.yaml").read_text())
    tpl["columns"]["answer"]["regex"] = r"^\d+$"  # leg_counting answers are digits; basic_arithmetic can be negative
    (contracts / "templates" / "reasoning_gym.yaml").write_text(yaml.safe_dump(tpl))
    cat = tmp_path / "cat"
    cat.mkdir()
    (cat / "p.yaml").write_text(yaml.safe_dump({**PACK, "tasks": ["leg_counting", "complex_arithmetic"],
                                                "tiers": ["easy"], "rows": 40}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TEMPER_HOME": str(tmp_path / "home"),
           "TEMPER_CONTRACTS_DIR": str(contracts), "TEMPER_CATALOG_DIR": str(cat)}
    run = lambda: subprocess.run([sys.executable, "-m", "temper.cli", "data", "generate"], cwd=REPO, env=env,
                                 capture_output=True, text=True)
    first = run()
    assert first.returncode == 1, first.stderr
    assert f"FAIL  rg-complex_arithmetic-easy: {cat / 'p.yaml'}: task 'complex_arithmetic' tier 'easy': " \
           f"generated data fails contract 'rg-complex_arithmetic-easy': column 'answer'" in first.stderr
    store = tmp_path / "home" / "store" / "datasets" / "packs" / "rg"
    assert sorted(p.name for p in store.iterdir()) == ["rg-leg_counting-easy.jsonl", "rg-leg_counting-easy.jsonl.spec"]
    second = run()
    assert "kept  rg-leg_counting-easy" in second.stdout
    monkeypatch.setenv("TEMPER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TEMPER_CATALOG_DIR", str(cat))
    get_settings.cache_clear()
    try:  # the one-domain generator hook gives the same bytes as the bulk path
        from temper.data.datasets import serialize_dataset
        from temper.data.generators import generate

        d = load_catalog(cat)["rg-leg_counting-easy"]
        frame = generate(d.dataset.generator, d.dataset.rows, d.dataset.seed, d.split.eval_fraction, d.dataset.generator_params)
        assert serialize_dataset(frame, "jsonl") == (store / "rg-leg_counting-easy.jsonl").read_bytes()
    finally:
        get_settings.cache_clear()


def test_verify_domain_cli_scores_with_the_domains_own_verifier(one_row_per_task, tmp_path):
    rows = one_row_per_task["rg-leg_counting-easy"]
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps({**r, "completion": c}) + "\n"
                               for r in rows for c in (r["reference"], "<answer>-1</answer>")))
    out = subprocess.run([sys.executable, "-m", "temper.cli", "verify", "--domain", "rg-leg_counting-easy", str(records)],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "TEMPER_CATALOG_DIR": str(REPO / "domains")},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    rewards = [json.loads(line)["reward"] for line in out[:-1]]
    assert rewards == [1.0, 0.0] * len(rows)
    assert json.loads(out[-1])["summary"]["pass_rate"] == pytest.approx(0.5)
    bad = subprocess.run([sys.executable, "-m", "temper.cli", "verify", "--domain", "rg-nope", str(records)], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert bad.returncode == 1 and "--domain rg-nope: no such domain" in bad.stderr
