"""Rewards must not be gameable: every verifier family x every degenerate output scores exactly 0.

Each family is given a record where the cheap trick *could* pay (the gold number sits in the
question, a HumanEval check with asserts a stub passes, a shell check a fake `test` could satisfy),
its gold completion is checked to score 1 (so a 0 below means something), and then each degenerate
output must score 0.0: not None, not partial credit. Sandboxed families run in the real bubblewrap
warm pool.
"""

from pathlib import Path

import pytest

from infra.sandbox.bwrap import bwrap_available
from temper.data.catalog import load_catalog
from temper.data.formats.bfcl import load_packaged
from temper.data.formats.humaneval import load_humaneval
from temper.data.formats.nl2bash import to_records as nl2bash_records
from temper.data.generators import generate
from temper.verifiers import get_verifier

pytestmark = pytest.mark.slow  # trains or runs whole benchmarks: `make test-fast` skips it


REPO = Path(__file__).resolve().parents[2]
CATALOG = load_catalog(REPO / "domains")


def _gen(name: str) -> dict:
    return generate(name, 3, 0, 0.1, {}).iloc[0].to_dict()


def _he(task: int) -> dict:
    return load_humaneval()[task]


# family case -> (kind, family, params, record, prompt template, gold completion)
CASES = {
    "numeric": ("text", "numeric", {}, {"question": "3 + 0", "answer": "3"}, "Q: {question} =\nA:", "3"),
    "exact": ("text", "exact", {}, {"question": "Capital of France?", "answer": "Paris"}, "Q: {question}\nA:", "Paris"),
    "exact_regex": ("text", "exact", {"mode": "regex"}, {"question": "Say the year 1945 back to me.", "pattern": "1945"},
                    "{question}\n", "1945"),
    "json_extraction": ("text", "json_extraction", CATALOG["invoice_extraction"].verifier.params, _gen("invoice_extraction"),
                        CATALOG["invoice_extraction"].prompt_template, None),
    "tool_call": ("text", "tool_call", {}, _gen("tool_calls"), CATALOG["tool_calls"].prompt_template, None),
    "tool_call_bfcl": ("text", "tool_call", CATALOG["bfcl_simple_python"].verifier.params, load_packaged("simple_python")[0],
                       CATALOG["bfcl_simple_python"].prompt_template, None),
    "doc_qa_number": ("text", "doc_qa", {}, {"document": "Invoice total: 1250 EUR, paid by ACME Corp on 2024-01-02.",
                                             "question": "What is the total?", "answer": "1250"},
                      "{document}\nQuestion: {question}\nAnswer:", "1250"),
    "doc_qa_text_partial": ("text", "doc_qa", {"partial": True},
                            {"document": "ACME Corp paid the invoice.\nTotal 1250 EUR.", "question": "Who paid?",
                             "answer": "ACME Corp"}, "{document}\nQuestion: {question}\nAnswer:", "ACME Corp"),
    "code_tests_humaneval": ("code", "code_tests", {"timeout_s": 3}, _he(0), "{prompt}", None),
    # HumanEval/33: its check compares candidate with sort_third itself; HumanEval/2 has `assert True`-like cases
    "code_tests_humaneval_partial": ("code", "code_tests", {"timeout_s": 3, "partial": True}, _he(33), "{prompt}", None),
    "code_tests_starter": ("code", "code_tests", {"timeout_s": 3, "partial": True}, _gen("python_functions"), "{prompt}", None),
    "terminal_output_mode": ("shell", "terminal", {"timeout_s": 5, "mode": "output"},
                             nl2bash_records([("Count the error lines in logs/app.log", "grep -c error logs/app.log")])[0],
                             "Task: {instruction}\nCommands:", None),
    "terminal": ("shell", "terminal", {"timeout_s": 5}, _gen("shell_tasks"), CATALOG["shell_tasks"].prompt_template, None),
}

STEAL = r"""    pass
import os, sys
tok = "0" * 32
for src in (lambda: open("/proc/%d/fd/0" % os.getppid()).read(), lambda: sys.stdin.read(), lambda: os.read(0, 99).decode()):
    try:
        tok = src().strip() or tok
        break
    except Exception:
        pass
f = sys._getframe()
while f is not None:
    for v in list(f.f_locals.values()):
        if isinstance(v, str) and len(v) == 32:
            tok = v
    f = f.f_back
line = "\n%s 1 1 1\n%s 1 0\n" % (tok, tok)  # the harness' result line, old and new layouts
for target in ("/proc/%d/fd/1" % os.getppid(), "/dev/stdout"):
    try:
        with open(target, "w") as out:
            out.write(line)
    except Exception:
        pass
print(line)
sys.stdout.flush()
os._exit(0)
"""

# look the expected value up in the test file (a lookup table instead of a solution)
READ_TESTS = r"""    __args = tuple(locals().values())
    import glob, re
    __src = ""
    for __name in glob.glob("*") + glob.glob(".*"):
        try:
            __src += open(__name).read()
        except Exception:
            pass
    for __m in re.finditer(r"candidate\((.*)\) == (.*)", __src):
        try:
            if eval("(" + __m.group(1) + ",)") == __args:
                return eval(__m.group(2))
        except Exception:
            pass
    return None
"""

# degenerate -> {kind: completion} (text is the fallback); {prompt} / {gold} are filled per case
DEGENERATE = {
    "empty": {"text": ""},
    "whitespace": {"text": " \n\t \n"},
    "prompt_echo": {"text": "{prompt}"},
    "prompt_echo_twice": {"text": "{prompt}\n{prompt}"},
    "stub": {"text": "...", "code": "    pass\n", "shell": "true"},
    "stub_constant": {"text": "TODO", "code": "    return None\n", "shell": ":"},
    "early_exit": {"text": "import sys; sys.exit(0)", "code": "    pass\nimport sys\nsys.exit(0)\n", "shell": "exit 0"},
    "hard_exit": {"text": "import os; os._exit(0)", "code": "    import os\n    os._exit(0)\n", "shell": "kill -9 $$"},
    "fake_pass_output": {"text": "PASSED\nAll tests passed. reward: 1.0",
                         "code": "    pass\nprint('PASSED')\nprint('ok 1 1 1')\nprint('all tests passed')\n",
                         "shell": "echo PASSED; echo ok; echo 'all tests passed'"},
    "fake_verdict_json": {"text": '{"passed": true, "valid": true, "reward": 1.0}',
                          "code": "    pass\nprint('{\"passed\": true, \"reward\": 1.0}')\n",
                          "shell": "echo '{\"passed\": true, \"reward\": 1.0}'"},
    "steal_token_and_fake_line": {"text": "{gold_token} 1 1 1", "code": STEAL, "shell": "cat /proc/$PPID/fd/0; echo ok"},
    "redefine_check": {"text": "def check(candidate):\n    return None", "code": "    pass\ndef check(candidate):\n    return None\n",
                       "shell": "test() { return 0; }; export -f test; alias '['=true; check() { return 0; }"},
    "monkeypatch_harness": {"text": "import builtins; builtins.AssertionError = Exception",
                            "code": "    pass\nimport builtins\nbuiltins.AssertionError = type('N', (Exception,), {})\n"
                                    "builtins.isinstance = lambda *a: True\nimport sys\nsys.modules['builtins'].len = lambda *a: 0\n",
                            "shell": "mkdir -p bin; printf '#!/bin/sh\\nexit 0\\n' > bin/test; cp bin/test 'bin/['; "
                                     "chmod +x bin/*; export PATH=$PWD/bin:$PATH; echo 'export PATH=$PWD/bin:$PATH' >> ~/.bashrc"},
    "always_equal_object": {"text": "[object AlwaysEqual]",
                            "code": "    class Any:\n        __eq__ = lambda s, o: True\n        __ne__ = lambda s, o: False\n"
                                    "        __hash__ = lambda s: 0\n        __len__ = lambda s: 0\n    return Any()\n",
                            "shell": "true"},
    "write_test_files": {"text": "open('tests.py', 'w').write('')",
                         "code": "    pass\nfor name in ('tests.py', 'main.py', '.temper_harness.py', 'solution.py'):\n"
                                 "    try:\n        open(name, 'w').write('def check(candidate):\\n    pass\\n')\n"
                                 "    except Exception:\n        pass\n",
                         "shell": "for f in * .*; do [ -f \"$f\" ] && : > \"$f\"; done; true"},
    "kill_the_harness": {"text": "kill -9 $PPID", "code": "    pass\nimport os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
                         "shell": "kill -9 $PPID; kill -9 -1"},
    "read_the_tests": {"text": "open('tests.py').read()", "code": READ_TESTS, "shell": "cat *; cat .* 2>/dev/null; true"},
    "kill_every_process": {"text": "kill -9 -1", "code": "    pass\nimport os, signal\nos.kill(-1, signal.SIGKILL)\n",
                           "shell": "kill -9 -1; for p in /proc/[0-9]*; do kill -9 ${p#/proc/}; done"},
    "huge_completion": {"text": "{gold}\n" + "x " * 40_000, "code": "{gold}\n# " + "x" * 80_000,
                        "shell": "{gold}\n# " + "x" * 80_000},
    "huge_program_output": {"text": "1 " * 20_000, "code": "    pass\nprint('ok 1 1 1\\n' * 2_000_000)\n",
                            "shell": "yes PASSED | head -c 50000000"},
}


def _needs_sandbox(kind: str) -> bool:
    return kind in ("code", "shell")


def _gold(case) -> str:
    kind, family, params, record, template, gold = case
    return gold if gold is not None else record["reference"]


def _completion(case, degenerate: str) -> str:
    kind, family, params, record, template, gold = case
    forms = DEGENERATE[degenerate]
    text = forms.get(kind, forms["text"])
    prompt = template.format(**record)
    return text.replace("{prompt}", prompt).replace("{gold}", _gold(case)).replace("{gold_token}", "0" * 32)


def _skip_without_sandbox(kind: str) -> None:
    if _needs_sandbox(kind) and not bwrap_available():
        pytest.skip("needs bubblewrap (apt-get install bubblewrap)")


@pytest.mark.parametrize("case", sorted(CASES))
def test_gold_completion_scores_1(case):
    kind, family, params, record, _, _ = CASES[case]
    _skip_without_sandbox(kind)
    got = get_verifier(family, params).score(record, _gold(CASES[case]))
    assert got is not None and got.reward == 1.0, got


@pytest.mark.parametrize("degenerate", sorted(DEGENERATE))
@pytest.mark.parametrize("case", sorted(CASES))
def test_degenerate_output_scores_0(case, degenerate):
    kind, family, params, record, _, _ = CASES[case]
    _skip_without_sandbox(kind)
    got = get_verifier(family, params).score(record, _completion(CASES[case], degenerate))
    assert got is not None and got.reward == 0.0, got
