"""`temper sandbox run` and `temper verify` as a user runs them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.sandbox.bwrap import bwrap_available

TEMPER = [str(Path(sys.executable).parent / "temper")]
needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap (apt-get install bubblewrap)")


def temper(*args):
    p = subprocess.run([*TEMPER, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


@needs_bwrap
def test_sandbox_run_file_and_command(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import os\nprint(os.getuid())\n")
    code, out, _ = temper("sandbox", "run", str(script))
    assert code == 0 and json.loads(out)["stdout"] == "65534\n"
    code, out, _ = temper("sandbox", "run", "--timeout", "0.5", "--", "sleep", "5")
    result = json.loads(out)
    assert code == 1 and result["verdict"] == "timeout" and result["wall_s"] < 1.5
    code, out, _ = temper("sandbox", "run", "--memory", "200", "--", "python3", "-c", "bytearray(2**30)")
    assert code == 1 and json.loads(out)["verdict"] == "memory"


def test_sandbox_run_refuses_a_mistyped_file_and_non_positive_limits(tmp_path):
    code, out, err = temper("sandbox", "run", str(tmp_path / "progg.py"))
    assert code == 1 and out == "" and f"no such file {tmp_path / 'progg.py'}" in err and len(err.splitlines()) == 1
    for flag, value in (("--timeout", "0"), ("--timeout", "-1"), ("--memory", "0"), ("--cpu", "-2")):
        code, out, err = temper("sandbox", "run", flag, value, "--", "true")
        assert code == 2 and out == "" and f"argument {flag}: must be > 0, got {value}" in err


@needs_bwrap
def test_sandbox_run_reports_a_cpu_limit_kill_as_cpu_limit_with_its_cpu_time(tmp_path):
    spin = tmp_path / "spin.py"
    spin.write_text("while True:\n    pass\n")
    code, out, _ = temper("sandbox", "run", "--cpu", "1", "--timeout", "30", str(spin))
    result = json.loads(out)
    assert code == 1 and result["verdict"] == "cpu_limit" and result["signal"] == 24
    assert 0.8 <= result["cpu_s"] <= 2.5  # burnt its second (GNU time's report), not the wall clock
    busy = tmp_path / "busy.py"
    busy.write_text("import resource\nwhile resource.getrusage(resource.RUSAGE_SELF).ru_utime < 1.0:\n    pass\n")
    code, out, _ = temper("sandbox", "run", "--timeout", "60", str(busy))
    result = json.loads(out)
    assert code == 0 and result["verdict"] == "ok" and result["cpu_s"] >= 0.95


def test_verify_prints_a_line_per_record_and_a_summary(tmp_path):
    records = tmp_path / "r.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "answer": "12", "completion": "#### 12"},
        {"id": "b", "answer": "3", "completion": "4"},
        {"id": "c", "question": "no answer column", "completion": "4"},
    ]) + "\n")
    code, out, _ = temper("verify", "--verifier", "numeric", "--params", '{"tolerance": 0.1}', str(records))
    lines = [json.loads(x) for x in out.splitlines()]
    assert code == 0
    assert [(x["id"], x["reward"]) for x in lines[:3]] == [("a", 1.0), ("b", 0.0), ("c", None)]
    why = "record has no 'answer' (numeric answer_field) to compare with"
    assert "not_judged" not in lines[0] and lines[2]["not_judged"] == why
    assert lines[3]["summary"] == {"records": 3, "judged": 2, "not_judged": 1, "not_judged_reasons": {why: 1},
                                   "mean_reward": pytest.approx(0.5), "pass_rate": pytest.approx(0.5)}


def test_verify_errors_name_the_input(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "completion": "x"}\nnot json\n')
    code, _, err = temper("verify", "--verifier", "numeric", str(bad))
    assert code == 1 and f"{bad}:2: not JSON" in err
    code, _, err = temper("verify", "--verifier", "nope", str(bad))
    assert code == 1 and "unknown verifier family 'nope'" in err
    code, _, err = temper("verify", "--verifier", "numeric", "--params", "{", str(bad))
    assert code == 1 and "--params: not JSON" in err


def generated(tmp_path, domain: str) -> tuple[dict, Path]:
    """`temper data generate --domain DOMAIN` into a fresh home; (env for temper, the dataset)."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TEMPER_HOME": str(tmp_path / "home"), "TEMPER_CATALOG_DIR": str(repo / "domains")}
    for var in ("TEMPER_TRACKING_URI", "TEMPER_STORAGE_ROOT", "TEMPER_S3_ENDPOINT_URL", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    p = subprocess.run([*TEMPER, "data", "generate", "--domain", domain], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return env, tmp_path / "home" / "store" / "datasets" / f"{domain}.jsonl"


@pytest.mark.parametrize("domain", [pytest.param("file_tasks", marks=needs_bwrap), "ledger_tasks"])
def test_verify_reference_passes_every_record_of_a_multi_step_dataset(tmp_path, domain):
    """The README's check that a dataset and its verifier agree: each reference (a JSON list of turns)
    is played as its turns and scores 1."""
    env, dataset = generated(tmp_path, domain)
    small = tmp_path / "some.jsonl"
    small.write_text("".join(dataset.read_text().splitlines(keepends=True)[:40]))
    p = subprocess.run([*TEMPER, "verify", "--domain", domain, "--reference", str(small)], capture_output=True,
                       text=True, env=env, timeout=300)
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert p.returncode == 0, p.stderr
    assert rows[-1]["summary"] == {"records": 40, "judged": 40, "not_judged": 0, "not_judged_reasons": {},
                                    "mean_reward": 1.0, "pass_rate": 1.0}, \
        [r for r in rows[:-1] if r["reward"] != 1.0][:3]
    first, second = (json.loads(x) for x in small.read_text().splitlines()[:2])
    broken = tmp_path / "broken.jsonl"  # a reference that is not a list of turns: one line naming the record
    broken.write_text(json.dumps(first) + "\n" + json.dumps({**second, "reference": "<done/>"}) + "\n")
    p = subprocess.run([*TEMPER, "verify", "--domain", domain, "--reference", str(broken)], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 1 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    assert f"{broken}: record(s) [2] have no reference to judge: 'reference' is not JSON" in p.stderr


def test_verify_scores_a_bracket_bomb_zero_and_every_other_record(tmp_path):
    env, dataset = generated(tmp_path, "ledger_tasks")
    recs = [json.loads(x) for x in dataset.read_text().splitlines()[:3]]
    recs[0]["completion"] = "<call>" + "[" * 3000 + "]" * 3000 + "</call><done/>"
    for rec in recs[1:]:
        rec["completion"] = "\n".join(json.loads(rec["reference"]))
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in recs))
    p = subprocess.run([*TEMPER, "verify", "--domain", "ledger_tasks", str(records)], capture_output=True, text=True,
                       env=env, timeout=60)
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert [r["reward"] for r in rows[:3]] == [0.0, 1.0, 1.0]
    assert rows[0]["details"]["outcome"] == "no_action" and "nested deeper than" in rows[0]["details"]["reason"]


@needs_bwrap
def test_a_program_that_never_started_is_not_ok(tmp_path):
    """Issue 29.5: each way a program fails to start read as verdict 'ok' with exit code 127."""
    noext = tmp_path / "prog"  # exists on the host, has no suffix: run as a command, absent in the sandbox
    noext.write_text("echo hi\n")
    cases = [(["--", "nosuchcmd"], 127), (["--", "/no/such/file", "arg"], 127), ([str(noext)], 127),
             (["--", "/etc/passwd"], 126)]  # there, but not executable
    for argv, exit_code in cases:
        code, out, _ = temper("sandbox", "run", *argv)
        result = json.loads(out)
        assert code == 1 and (result["verdict"], result["exit_code"]) == ("not_started", exit_code), (argv, result)
    code, out, _ = temper("sandbox", "run", "--memory", "1", "--", "true")  # the loader cannot map libc
    result = json.loads(out)
    assert code == 1 and result["verdict"] == "memory" and "failed to map segment" in result["stderr"], result
    # a program that started and then reported 127 itself keeps its own verdict
    code, out, _ = temper("sandbox", "run", "--", "bash", "-c", "nosuchcmd")
    result = json.loads(out)
    assert code == 1 and (result["verdict"], result["exit_code"]) == ("ok", 127), result


# Burns CPU, holds ~200 MB resident, and prints the CPU it has used so far, so the usage the
# sandbox reports after killing it can be checked against the program's own count (the machine
# may be busy: a 2 s timeout does not mean 2 s of CPU).
BUSY_AND_BIG = """
import time
big = bytearray(200 << 20)
for i in range(0, len(big), 4096):
    big[i] = 1
last = 0.0
while True:
    now = time.process_time()
    if now - last > 0.02:
        print(now, flush=True)
        last = now
"""


@needs_bwrap
@pytest.mark.parametrize("shape", ["program", "child of a shell"])
def test_a_timed_out_program_reports_the_cpu_and_memory_it_used(shape):
    """Issue 29.6: a timed-out loop reported cpu_s 0.004 and max_rss 36 MB (bwrap's own, not the program's)."""
    argv = ["python3", "-c", BUSY_AND_BIG]
    if shape != "program":  # the shell waits for python: python is ended first, so the shell counts it
        argv = ["bash", "-c", f"python3 -c '{BUSY_AND_BIG}'; echo after"]
    code, out, _ = temper("sandbox", "run", "--timeout", "2", "--memory", "1024", "--", *argv)
    result = json.loads(out)
    assert code == 1 and result["verdict"] == "timeout" and result["signal"] == 9, result
    seen = float(result["stdout"].split()[-1])  # the program's own CPU count shortly before it was killed
    assert seen > 0.2, result  # it did run for a while
    # GNU time prints user and system time each cut to hundredths, so their sum may read up to 0.02 low
    assert seen - 0.02 <= result["cpu_s"] <= seen + 0.5, (seen, result)
    assert result["max_rss_mb"] >= 200, result
    assert "after" not in result["stdout"]
    assert result["wall_s"] < 2.5
