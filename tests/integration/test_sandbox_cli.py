"""`temper sandbox run` and `temper verify` as a user runs them."""

import json
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
