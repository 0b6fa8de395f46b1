"""`temper k8s render`: the exact manifests a run would submit, for review or `kubectl apply`."""

from __future__ import annotations

import argparse
from pathlib import Path


def render(args) -> int:
    from infra.k8s.render import load_render_config, render as render_docs, write_manifests

    cfg = load_render_config(args.config)
    for p in write_manifests(render_docs(cfg), args.out):
        print(p)
    return 0


def register(sub) -> None:
    p = sub.add_parser("k8s", help="Kubernetes manifests for runs")
    s = p.add_subparsers(dest="k8s_command", required=True, metavar="SUBCOMMAND")
    r = s.add_parser("render", help="write the manifests a run would submit (YAML, one file per object)")
    r.add_argument("--config", type=Path, required=True, help="render config: job (JobSpec) + kubernetes options")
    r.add_argument("--out", type=Path, required=True, help="output directory")
    r.set_defaults(func=render)
