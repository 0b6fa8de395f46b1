"""`temper serve --model DIR`: the embedded rollout engine behind an OpenAI-compatible HTTP API.

The same clients that talk to vLLM talk to it (`temper.rollout.client`, the `openai` package):
POST /v1/completions and /v1/chat/completions (stream=true for SSE), GET /v1/models, /health, /metrics.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from temper.core.errors import TemperError, describe_validation_error


def run(args) -> int:
    # lazy: pydantic (125 ms), via config, would load at every `temper` start-up
    from temper.rollout.config import (
        MIB,
        EngineConfig,
        PrefixCacheConfig,
        SpeculativeConfig,
    )

    for flag, folder in (("--model", args.model), ("--draft", None if args.draft in (None, "int8") else args.draft)):
        if folder is not None and not (Path(folder) / "config.json").is_file():
            raise TemperError(f"serve: {flag} {folder} is not a model folder (no config.json); models are never "
                              f"downloaded here")
    try:
        spec = None
        if args.draft is not None and args.profile != "fast":
            raise TemperError("serve: --draft is for --profile fast")
        if args.profile == "fast":
            spec = (SpeculativeConfig() if args.draft is None
                    else SpeculativeConfig(method="draft_model", quantize_draft=True) if args.draft == "int8"
                    else SpeculativeConfig(method="draft_model", draft_dir=args.draft))
        config = EngineConfig(model_dir=args.model, served_model_name=args.served_model_name, profile=args.profile,
                              speculative=spec,
                              prefix_cache=PrefixCacheConfig(enabled=args.cache_mb > 0,
                                                             budget_bytes=int(args.cache_mb * MIB)),
                              max_context_tokens=args.max_context, torch_threads=args.threads)
    except ValidationError as e:
        raise TemperError(describe_validation_error("serve", e)) from None
    # lazy: torch+fastapi+pydantic_settings+... (2.0 s), via engine, would load at every `temper` start-up
    import uvicorn

    from temper.rollout.engine import Engine
    from temper.rollout.server import create_app

    try:
        engine = Engine(config)
    except OSError as e:
        raise TemperError(f"serve: cannot load model {args.model}: {e}") from None
    print(f"serving {args.model} as '{config.served_model_name}' ({config.profile}) on "
          f"http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible API (embedded rollout engine)",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, metavar="DIR", help="HF model folder (with its tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--profile", choices=["standard", "fast"], default="standard",
                   help="fast = speculative decoding: prompt lookup, or a --draft model (must pass the parity gate "
                        "before use)")
    p.add_argument("--draft", default=None, metavar="DIR|int8", help="fast profile's draft model folder, or 'int8' (default: "
                   "prompt lookup, no draft model)")
    p.add_argument("--served-model-name", default="temper", help="the `model` name clients send")
    p.add_argument("--cache-mb", type=float, default=256, help="prefix KV cache budget in MiB (0 = off)")
    p.add_argument("--max-context", type=int, default=None, help="context limit (default: the model's)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)
