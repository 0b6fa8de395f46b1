"""`temper sandbox run FILE | -- CMD ...`: run untrusted code in the local sandbox, print a JSON verdict.

Exit status 0 when the program ran to completion and exited 0, 1 otherwise (the JSON says why:
its ``verdict``, e.g. ``not_started`` for a command or file the sandbox could not run, ``timeout``
with the CPU and peak memory the program had used when it was stopped).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from temper.core.errors import TemperError

_SUFFIX_PROFILE = {".py": "python", ".sh": "shell", ".bash": "shell"}


def run(args) -> int:
    # lazy: infra.sandbox adds 11 ms to every `temper` start-up (--help loads all commands)
    from infra.sandbox import get_profile
    from infra.sandbox import run as sandbox_run

    target = list(args.target)
    if not target:
        raise TemperError("sandbox run: give a FILE (.py or .sh) or a command after --")
    path = Path(target[0])
    looks_like_file = path.suffix in _SUFFIX_PROFILE or "/" in target[0]
    if len(target) == 1 and looks_like_file and not path.is_file():
        raise TemperError(f"sandbox run: no such file {path} (to run a command, give it after --)")
    is_file = len(target) == 1 and path.is_file() and (args.profile or path.suffix in _SUFFIX_PROFILE)
    profile = get_profile(args.profile or (_SUFFIX_PROFILE.get(path.suffix, "python") if is_file else "shell"))
    limits = profile.limits.merged(wall_s=args.timeout, memory_mb=args.memory, cpu_s=args.cpu)
    if is_file:
        try:
            code = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise TemperError(f"sandbox run: cannot read {path}: {e}") from None
        result = sandbox_run(code=code, profile=profile.name, limits=limits)
    else:
        result = sandbox_run(target, profile=profile.name, limits=limits)
    print(json.dumps(result.model_dump()))
    return 0 if result.ok else 1


def _positive(kind):
    """An argparse type: a number of ``kind`` that must be > 0 (a limit of 0 or less means nothing)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def register(subparsers) -> None:
    p = subparsers.add_parser("sandbox", help="run code in the isolated local sandbox (bubblewrap)")
    sub = p.add_subparsers(dest="sandbox_command", required=True, metavar="SUBCOMMAND")
    r = sub.add_parser("run", help="run a .py/.sh FILE, or a command given after --",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("--timeout", type=_positive(float), default=None, help="wall-clock seconds (default: the profile's)")
    r.add_argument("--memory", type=_positive(int), default=None, metavar="MB", help="address-space limit in MiB")
    r.add_argument("--cpu", type=_positive(int), default=None, metavar="S", help="CPU seconds per process")
    r.add_argument("--profile", choices=["python", "shell"], default=None,
                   help="sandbox profile (default: from the file suffix; shell for commands)")
    r.add_argument("target", nargs="*", metavar="FILE | -- CMD", help="a file to run, or a command after --")
    r.set_defaults(func=run)
