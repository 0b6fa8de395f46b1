"""Bad input at the command line, as a new user types it: one line naming the problem, a non-zero
exit, nothing written."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv, message", [
    (["--hidden", "30", "--heads", "4"], "--hidden 30 must split into --heads 4 heads of an even size"),
    (["--hidden", "24", "--heads", "0"], "--heads must be >= 1, got 0"),
    (["--layers", "-1"], "--layers must be >= 1, got -1"),
])
def test_init_tiny_refuses_shapes_that_cannot_build_a_model(tmp_path, capsys, argv, message):
    from temper.cli import main

    out = tmp_path / "tiny"
    assert main(["model", "init-tiny", "--out", str(out), *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not out.exists()
