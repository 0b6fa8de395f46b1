"""The ``temper`` command. Each command group lives in ``temper/commands/<group>.py``.

A group module exposes ``register(subparsers)``, which adds its parser(s) and sets
``func`` (a callable taking the parsed args and returning an exit code). Heavy imports
(torch, mlflow, great_expectations) happen inside handlers, so ``temper --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from temper.core.errors import TemperError

# Order = order in --help.
COMMAND_GROUPS = (
    "demo",
    "resume",
    "up",
    "data",
    "domains",
    "lineage",
    "model",
    "models",
    "train",
    "sandbox",
    "verify",
    "replay",
    "serve",
    "k8s",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="temper", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        try:
            module = importlib.import_module(f"temper.commands.{group}")
        except ModuleNotFoundError as e:
            if e.name == f"temper.commands.{group}":
                continue  # group not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except TemperError as e:
        print(f"temper: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("temper: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
