"""How the bwrap backend reads a program that never started (issue 29.5), without starting a sandbox."""

from __future__ import annotations

import pytest

from infra.sandbox.api import Result
from infra.sandbox.bwrap import _not_started


@pytest.mark.parametrize("verdict, code, stderr, expected", [
    ("ok", 127, "/usr/bin/time: cannot run nosuchcmd: No such file or directory\n", "not_started"),
    ("ok", 126, "/usr/bin/time: cannot run /etc/passwd: Permission denied\n", "not_started"),
    ("error", 1, "bwrap: execvp nosuchcmd: No such file or directory\n", "not_started"),  # no GNU time
    ("ok", 127, "./prog: error while loading shared libraries: libfoo.so: cannot open shared object file\n",
     "not_started"),
    ("ok", 127, "/usr/bin/time: error while loading shared libraries: libc.so.6: failed to map segment from "
                "shared object\n", "memory"),
    ("ok", 127, "python3: error while loading shared libraries: libm.so.6: cannot map zero-fill pages\n", "memory"),
    # the program started and said so itself: its own verdict stands
    ("ok", 127, "bash: line 1: nosuchcmd: command not found\n", "ok"),
    ("ok", 127, "hello\n/usr/bin/time: cannot run x: No such file or directory\n", "ok"),
    ("ok", 0, "/usr/bin/time: cannot run x: No such file or directory\n", "ok"),
    ("error", 1, "bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n", "error"),
    ("timeout", None, "/usr/bin/time: cannot run x: No such file or directory\n", "timeout"),
])
def test_not_started_is_told_apart_from_a_program_that_ran(verdict, code, stderr, expected):
    result = Result(verdict=verdict, exit_code=code, stderr=stderr)
    got = _not_started(result)
    assert got.verdict == expected
    if expected == "not_started":
        assert got.exit_code in (126, 127) and not got.ok
