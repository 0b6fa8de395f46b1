"""The code_tests harness: the program that runs inside the sandbox box (``python3 -I``).

Why it is split in two processes: if the tests and the completion share an interpreter, the
completion can always fake success (exit early with status 0, print whatever the verifier looks
for, walk the stack to the harness' secret, monkeypatch ``check``). So the *tests* run in a trusted
parent and the *completion* in a forked child that only answers calls of the entry point:

- parent: becomes non-dumpable (the child cannot open its /proc fds or memory), forks the child,
  then reads ``tests.py`` (the problem's prompt + test code, trusted) and deletes it, and only then
  lets the child start: the tests are neither on disk nor in the child's memory. It runs
  ``check(candidate)`` where ``candidate`` forwards each call to the child;
- child: closes stdin, points stdout at stderr, executes ``solution.py`` (prompt + completion) and
  serves calls: arguments arrive pickled (trusted data), results go back as tagged JSON, which the
  parent decodes into plain builtin values only. A result that is not plain data (an object whose
  ``__eq__`` always says True, a str subclass ...) is an error, so it fails the assert that uses it;
- after ``check``, the parent kills the child, only then reads the per-run token from stdin and
  prints ``<token> <ok> <passed> <total>``. The child never had the token and never had the stdout.

Strict (the benchmark's own rule): ``ok`` is 1 when ``check`` returned without an exception (in
partial mode: returned with no assert failing).
Partial (opt-in): each ``assert`` of ``check`` is tallied; asserts that a do-nothing candidate
(returns None, raises, returns its first argument, 0, '', [], True or False) also passes do not
count, so a stub never earns reward; ``passed``/``total`` are over the remaining asserts.

The child answers with what the completion computes; a child that dies, hangs (the box's wall
clock) or talks nonsense makes the call raise, i.e. the assert fail: never a pass.
Usage: python3 -I harness.py ENTRY_POINT PARTIAL(0|1)  (token on stdin)
"""

import ast
import json
import os
import pickle
import signal
import struct
import sys

MAX_MESSAGE = 16 << 20


class CandidateError(Exception):
    """A call of the completion's entry point failed (raised, died, or returned no plain value)."""


def _send(fd, data):
    view = memoryview(struct.pack(">Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _recv(fd):
    head = _read_exact(fd, 8)
    (size,) = struct.unpack(">Q", head)
    if size > MAX_MESSAGE:
        raise CandidateError("reply too large")
    return _read_exact(fd, size)


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise CandidateError("the solution process ended")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# --- plain values across the process boundary -------------------------------------------------
def encode(x):
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list or t is tuple or t is set or t is frozenset:
        return {{list: "l", tuple: "t", set: "s", frozenset: "f"}[t]: [encode(i) for i in x]}
    if t is dict:
        return {"d": [[encode(k), encode(v)] for k, v in x.items()]}
    if t is bytes:
        return {"b": x.hex()}
    raise TypeError("returned a %s, not a plain value" % t.__name__)


_BUILD = {"l": list, "t": tuple, "s": set, "f": frozenset}


def decode(x):
    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) is dict and len(x) == 1:
        (tag, v), = x.items()
        if tag in _BUILD and type(v) is list:
            return _BUILD[tag](decode(i) for i in v)
        if tag == "d" and type(v) is list:
            return {decode(k): decode(val) for k, val in v}
        if tag == "b" and type(v) is str:
            return bytes.fromhex(v)
    raise CandidateError("malformed reply")


# --- the untrusted side -------------------------------------------------------------------------
def serve(entry, requests, replies):
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)
    try:
        _recv(requests)  # "go": sent once the parent has read and deleted tests.py
    except CandidateError:
        os._exit(0)
    try:
        with open("solution.py") as f:
            source = f.read()
        ns = {"__name__": "solution"}
        exec(compile(source, "solution.py", "exec"), ns)
        fn = ns[entry]
    except BaseException as e:  # the completion does not even load: every call fails
        fn, load_error = None, "%s: %s" % (type(e).__name__, e)
    while True:
        try:
            args, kwargs = pickle.loads(_recv(requests))
        except CandidateError:
            os._exit(0)
        try:
            if fn is None:
                raise CandidateError(load_error)
            reply = b"R" + json.dumps(encode(fn(*args, **kwargs))).encode()
        except BaseException as e:
            reply = b"E" + ("%s: %s" % (type(e).__name__, e)).encode("utf-8", "replace")[:2000]
        _send(replies, reply)


# --- the trusted side ---------------------------------------------------------------------------
class Proxy:
    def __init__(self, requests, replies):
        self.requests, self.replies = requests, replies

    def __call__(self, *args, **kwargs):
        _send(self.requests, pickle.dumps((args, kwargs)))
        reply = _recv(self.replies)
        if reply[:1] == b"R":
            try:
                return decode(json.loads(reply[1:]))
            except (ValueError, RecursionError):
                raise CandidateError("malformed reply") from None
        raise CandidateError(reply[1:].decode("utf-8", "replace"))


class Tally(ast.NodeTransformer):
    """Wrap each assert of ``check``: record which asserts passed on every execution."""

    def __init__(self):
        self.count = 0

    def visit_Assert(self, node):
        i = self.count
        self.count += 1
        ok = ast.parse("__temper_passed__.add(%d)" % i).body
        bad = ast.parse("__temper_failed__.add(%d)" % i).body
        handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name=None, body=bad)
        return ast.copy_location(ast.Try(body=[node] + ok, handlers=[handler], orelse=[], finalbody=[]), node)


def _passed(ns, entry, candidate):
    """Asserts passed on every execution, and whether the whole check passed (returned, none failed)."""
    ns["__temper_passed__"], ns["__temper_failed__"] = set(), set()
    ns[entry] = candidate
    try:
        ns["check"](candidate)
        returned = True
    except Exception:
        returned = False
    return ns["__temper_passed__"] - ns["__temper_failed__"], returned and not ns["__temper_failed__"]


def _raise(*_a, **_k):
    raise ValueError("do-nothing candidate")


DO_NOTHING = [lambda *a, **k: None, _raise, lambda *a, **k: a[0] if a else None, lambda *a, **k: 0,
              lambda *a, **k: "", lambda *a, **k: [], lambda *a, **k: True, lambda *a, **k: False]


def main():
    entry, partial = sys.argv[1], sys.argv[2] == "1"
    try:
        # lazy: best effort inside the try; a box whose Python lacks ctypes still runs the tests
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/<pid>/fd|mem for the child
    except Exception:
        pass
    # Fork before the tests are read, so the child's copy of this process holds none of them
    # (no AST to search with gc); it starts the completion only after tests.py is gone from disk.
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(req_w)
        os.close(rep_r)
        try:
            serve(entry, req_r, rep_w)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(rep_w)
    with open("tests.py") as f:
        tree = ast.parse(f.read(), "tests.py")
    os.unlink("tests.py")
    tally = Tally()
    if partial:
        tree.body = [tally.visit(n) if isinstance(n, ast.FunctionDef) and n.name == "check" else n for n in tree.body]
        ast.fix_missing_locations(tree)
    code = compile(tree, "tests.py", "exec")
    _send(req_w, b"go")
    ns = {"__name__": "tests"}
    ok, passed = 1, set()
    try:
        exec(code, ns)
        if partial:
            passed, ok = _passed(ns, entry, Proxy(req_w, rep_r))
            ok = int(ok)
        else:
            ns[entry] = candidate = Proxy(req_w, rep_r)  # tests may call the function by name too
            ns["check"](candidate)
    except Exception as e:
        ok = 0
        sys.stderr.write("check failed: %s: %s\n" % (type(e).__name__, str(e)[:500]))
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if partial:
        trivial = set()
        for candidate in DO_NOTHING:
            trivial |= _passed(ns, entry, candidate)[0]
        counted = set(range(tally.count)) - trivial
        passed_n, total = len(passed & counted), len(counted)
    else:
        passed_n, total = ok, 1
    token = sys.stdin.readline().strip()
    sys.stdout.write("\n%s %d %d %d\n" % (token, ok, passed_n, total))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
