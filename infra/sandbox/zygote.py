"""A Python interpreter started inside a sandbox before its program is known (the warm path).

Starting bwrap's namespaces and the interpreter is most of a short program's cost. A warm box
starts ``python3 -I -c ZYGOTE`` ahead of time, under the profile's limits; the interpreter
blocks reading stdin. A run of ``python3 -I FILE ARGS...`` then sends a small request (argv
and the run's rlimits, which may only be lowered) and the zygote runs FILE as
``__main__`` the way ``python3 -I FILE`` would: same flags (isolated, no script dir on sys.path),
absolute ``__file__``, ``sys.argv``, traceback without the zygote's frame, exit status 1 on an
uncaught exception, 2 for a missing file. The rest of stdin is the program's stdin.
"""

from __future__ import annotations

from collections.abc import Mapping

from infra.sandbox.api import Limits

# No json/types import: importing json (re, enum) alone costs ~15 ms of a ~20 ms startup.
ZYGOTE = r"""
import os, resource, sys
_fields = sys.stdin.buffer.read(int(sys.stdin.buffer.readline())).decode("utf-8", "surrogateescape").split("\0")
_limits = [int(v) for v in _fields[0].split()]
for _i, _name in enumerate(("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE")):
    _res = getattr(resource, _name)
    _top = resource.getrlimit(_res)[1]
    _soft, _hard = _limits[2 * _i], _limits[2 * _i + 1]
    if _top != resource.RLIM_INFINITY:
        _soft, _hard = min(_soft, _top), min(_hard, _top)
    resource.setrlimit(_res, (_soft, _hard))
sys.argv = _fields[3:]
_path = os.path.abspath(sys.argv[0])
try:
    with open(_path, "rb") as _f:
        _code = compile(_f.read(), _path, "exec", dont_inherit=True)
except OSError as _e:
    sys.stderr.write(f"python3: can't open file {_path!r}: [Errno {_e.errno}] {_e.strerror}\n")
    sys.exit(2)
except SyntaxError as _e:
    import traceback
    traceback.print_exception(_e.__class__, _e, None)
    sys.exit(1)
_main = type(sys)("__main__")
_main.__file__ = _path
sys.modules["__main__"] = _main
try:
    exec(_code, _main.__dict__)
except SystemExit:
    raise
except BaseException as _e:
    import traceback
    traceback.print_exception(_e.__class__, _e, _e.__traceback__.tb_next)
    sys.exit(1)
"""

_PYTHONS = ("python3", "/usr/bin/python3")


def _rlimits(limits: Limits) -> list[int]:
    """(soft, hard) of AS, CPU, NPROC, FSIZE, NOFILE, flattened in the zygote's order."""
    mem, fsize = limits.memory_mb << 20, limits.fsize_mb << 20
    return [mem, mem, limits.cpu_s, limits.cpu_s + 1, limits.nproc, limits.nproc, fsize, fsize,
            limits.nofile, limits.nofile]


def can_serve(argv: list[str], limits: Limits, warm_limits: Limits, env: Mapping[str, str] | None) -> bool:
    """A warm zygote can run this request: ``python3 -I FILE ...``, no extra env, limits not raised."""
    if env or len(argv) < 3 or argv[0] not in _PYTHONS or argv[1] != "-I" or argv[2].startswith("-"):
        return False
    fields = ("memory_mb", "cpu_s", "nproc", "fsize_mb", "nofile")
    return limits.tmp_mb == warm_limits.tmp_mb and all(getattr(limits, f) <= getattr(warm_limits, f) for f in fields)


def request(argv: list[str], limits: Limits) -> bytes:
    """Length line, then NUL-separated: the rlimits, then argv (argv cannot hold NUL bytes)."""
    payload = "\0".join([" ".join(map(str, _rlimits(limits))), *argv]).encode("utf-8", "surrogateescape")
    return f"{len(payload)}\n".encode() + payload
