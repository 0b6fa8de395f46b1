"""The repair domains' hidden tests, run in a fresh sandbox box (``python3 -I``; the standard library only).

Why two processes, as in the code_tests harness (temper/verifiers/families/code_harness.py): code
that shares an interpreter with the tests that judge it can always fake a pass (exit 0 early, print
what the judge looks for, patch the runner). So the *cases* live in a trusted parent and the
*project* is imported in a forked child that only answers calls:

- parent: becomes non-dumpable (the child cannot read its memory or fds through /proc), forks the
  child, then reads the cases file and deletes it, and only then lets the child start: the
  expected values are neither on disk nor in the child's memory;
- child: stdin from /dev/null, stdout onto stderr, the work dir first on sys.path; per request
  ``[module, function, args]`` it imports ``PACKAGE.module`` and answers one JSON line with the
  result (``json.dumps`` refuses anything but plain data, and the parent reads plain data back);
  an import that fails (a ``sys.exit`` in the package, a wrong import) fails every call of it;
- parent: compares each answer with the expected value by ``same`` (plain data; True is not 1,
  floats within 1e-9), kills the child, only then reads the run's token from
  stdin and prints ``<token> <passed> <total>``. The child never had the token or the stdout.

A child that dies, hangs (the box's wall clock ends the run: no token line, reward 0) or answers
nonsense fails the case: never a pass. The host imports this module for ``same`` only.
Usage: python3 -I .temper_repair.py PACKAGE  (token on stdin)
"""

import ctypes
import importlib
import json
import math
import os
import signal
import sys

CASES_FILE = ".temper_cases.json"
MAX_ANSWER = 1 << 20  # bytes of one answer; a larger one fails its case unread


def same(got, want):
    """Equal as plain JSON data: numbers as numbers (4 equals 4.0; floats within a relative 1e-9), but
    a bool only equals a bool and None only None; lists in order, dicts by key."""
    if type(want) in (int, float) and type(got) in (int, float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    if type(got) is not type(want):
        return False
    if type(want) is list:
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    if type(want) is dict:
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return got == want


def answer_calls(package, requests, answers):
    """The untrusted side: import the project's modules on demand and answer each call."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)
    sys.path.insert(0, os.getcwd())
    if requests.readline() != "go\n":
        os._exit(0)
    for line in requests:
        module, function, args = json.loads(line)
        try:
            result = getattr(importlib.import_module(package + "." + module), function)(*args)
            out = json.dumps({"ok": result})
        except BaseException as e:  # SystemExit and KeyboardInterrupt included: a call that exits failed
            out = json.dumps({"error": "%s: %s" % (type(e).__name__, str(e)[:300])})
        answers.write(out + "\n")
        answers.flush()


def main():
    package = sys.argv[1]
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except Exception:
        pass
    (req_r, req_w), (ans_r, ans_w) = os.pipe(), os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    child = pid == 0
    for fd in (req_w, ans_r) if child else (req_r, ans_w):  # each side keeps the ends it uses
        os.close(fd)
    if child:
        try:
            answer_calls(package, os.fdopen(req_r), os.fdopen(ans_w, "w"))
        finally:
            os._exit(0)
    with open(CASES_FILE) as f:
        cases = json.load(f)
    os.unlink(CASES_FILE)
    requests, answers = os.fdopen(req_w, "w"), os.fdopen(ans_r, "rb")
    passed = 0
    try:
        requests.write("go\n")
        requests.flush()
        for case in cases:
            requests.write(json.dumps([case["module"], case["function"], case["args"]]) + "\n")
            requests.flush()
            line = answers.readline(MAX_ANSWER + 1)
            if not line.endswith(b"\n"):
                break  # the child is gone, or the answer is over MAX_ANSWER: every case left fails
            try:
                reply = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if type(reply) is dict and "ok" in reply and same(reply["ok"], case["expect"]):
                passed += 1
            else:
                sys.stderr.write("FAIL %s.%s%r: %s\n" % (case["module"], case["function"], tuple(case["args"]),
                                                       line[:200].decode("utf-8", "replace").strip()))
    except (BrokenPipeError, OSError):
        pass
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    token = sys.stdin.readline().strip()
    sys.stdout.write("\n%s %d %d\n" % (token, passed, len(cases)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
