"""`temper k8s`: the exact manifests a run would submit, and the cluster options a flow run would use."""

from __future__ import annotations

import os
from pathlib import Path


def render(args) -> int:
    # lazy: kubernetes+yaml (411 ms), via render, would load at every `temper` start-up
    from infra.k8s.render import load_render_config, write_manifests
    from infra.k8s.render import render as render_docs

    cfg = load_render_config(args.config)
    for p in write_manifests(render_docs(cfg), args.out):
        print(p)
    return 0


def options(args) -> int:
    """Validate an options file (the temper-k8s-options ConfigMap's options.yaml) and print it in full."""
    # lazy: yaml (11 ms), via options, would load at every `temper` start-up
    import yaml

    from infra.k8s.options import OPTIONS_ENV, load_options, options_from_env

    if args.file:
        opts, source = load_options(args.file), str(args.file)
    else:
        env_path = os.environ.get(OPTIONS_ENV)
        opts, source = options_from_env(), f"{OPTIONS_ENV}={env_path}" if env_path else "built-in defaults"
    print(f"# effective KubernetesOptions from {source}")
    print(yaml.safe_dump(opts.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def register(sub) -> None:
    p = sub.add_parser("k8s", help="Kubernetes manifests for runs")
    s = p.add_subparsers(dest="k8s_command", required=True, metavar="SUBCOMMAND")
    r = s.add_parser("render", help="write the manifests a run would submit (YAML, one file per object)")
    r.add_argument("--config", type=Path, required=True, help="render config: job (JobSpec) + kubernetes options")
    r.add_argument("--out", type=Path, required=True, help="output directory")
    r.set_defaults(func=render)
    o = s.add_parser("options", help="validate a cluster options file and print every option's value")
    o.add_argument("--file", type=Path, help="options YAML (default: the file $TEMPER_K8S_OPTIONS names, "
                   "else the built-in defaults)")
    o.set_defaults(func=options)
