"""``temper model init-tiny --out DIR``: a tiny random Llama + local tokenizer for tests and demos."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("model", help="base-model utilities")
    sub = p.add_subparsers(dest="model_command", required=True)
    t = sub.add_parser("init-tiny", help="write a tiny randomly initialised Llama-style model folder")
    t.add_argument("--out", required=True, help="output folder (HF format)")
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    from temper.training.tiny import init_tiny

    out = init_tiny(args.out, hidden=args.hidden, layers=args.layers, heads=args.heads, seed=args.seed)
    print(f"tiny model written to {out}")
    return 0
