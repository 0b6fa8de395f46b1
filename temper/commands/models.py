"""`temper models list|compare|promote|rollback|history`: operate the model registry by hand.

Thin over ``temper.registry`` (versions, compare, aliases, audit); the same functions back the
Prefect flows in ``flows/registry_ops.py``. Errors (unknown model/version/alias, gate says no, nothing to roll
back to) are TemperErrors: one line on stderr, exit 1, no alias changed.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict

from temper.registry.gate import PromotionPolicy
from temper.registry.versions import format_versions, list_versions


def _configure() -> None:
    # lazy: pydantic_settings (130 ms), via infra.tracking, would load at every `temper` start-up
    from infra.tracking.connection import configure

    # compare downloads per-sample rewards; MLflow's progress bars would bury the table
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    configure(existing=True)


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _print_change(change, as_json: bool) -> int:
    if as_json:
        _print_json(change.to_dict())
    else:
        print(change.summary())
    return 0


def list_cmd(args) -> int:
    _configure()
    versions = list_versions(args.model)
    if args.json:
        _print_json([asdict(v) for v in versions])
    else:
        print(format_versions(args.model, versions))
    return 0


def compare_cmd(args) -> int:
    # lazy: pydantic_settings+scipy+numpy (330 ms), via compare, would load at every `temper` start-up
    from temper.registry.compare import compare, format_comparison

    _configure()
    cmp = compare(args.model, args.a, args.b, args.domains, log=not args.no_log, seed=args.seed)
    if args.json:
        _print_json(cmp.to_dict())
    else:
        print(format_comparison(cmp))
    return 0


def promote_cmd(args) -> int:
    # lazy: temper.registry.aliases adds 9 ms to every `temper` start-up (--help loads all commands)
    from temper.registry.aliases import promote

    _configure()
    policy = PromotionPolicy(min_improvement=args.min_improvement, max_regression=args.max_regression,
                             min_reward=args.min_reward, significance=args.significance)
    change = promote(args.model, args.version, reason=args.reason, alias=args.alias, force=args.force,
                                  policy=policy)
    return _print_change(change, args.json)


def rollback_cmd(args) -> int:
    # lazy: temper.registry.aliases adds 9 ms to every `temper` start-up (--help loads all commands)
    from temper.registry.aliases import rollback

    _configure()
    change = rollback(args.model, alias=args.alias, reason=args.reason)
    return _print_change(change, args.json)


def history_cmd(args) -> int:
    # lazy: temper.registry.aliases adds 9 ms to every `temper` start-up (--help loads all commands)
    from temper.registry.aliases import audit_trail
    from temper.registry.audit import format_trail

    _configure()
    events = audit_trail(args.model, args.alias)
    if args.json:
        _print_json([asdict(e) for e in events])
    else:
        print(format_trail(args.model, args.alias, events))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    defaults = PromotionPolicy()
    p = sub.add_parser("models", help="registry operations: list, compare, promote, rollback, history")
    s = p.add_subparsers(dest="models_command", required=True, metavar="SUBCOMMAND")

    def command(name: str, func, help: str):
        """A subcommand over one registered model, with --json."""
        c = s.add_parser(name, help=help)
        c.add_argument("model")
        c.add_argument("--json", action="store_true")
        c.set_defaults(func=func)
        return c

    command("list", list_cmd, "versions with aliases, base model, datasets, eval summary, created time")

    c = command("compare", compare_cmd, "per-domain metrics of two versions, deltas B - A, bootstrap significance")
    c.add_argument("a", help="version number or alias (the baseline)")
    c.add_argument("b", help="version number or alias (compared against A)")
    c.add_argument("--domains", default=None, metavar="GLOB", help="only domains matching this glob")
    c.add_argument("--no-log", action="store_true", help="do not record the table and chart in MLflow")
    c.add_argument("--seed", type=int, default=0, help="bootstrap seed (results are reproducible)")

    pr = command("promote", promote_cmd, "move an alias to a version through the gate, with an audit trail")
    pr.add_argument("version", help="version number (or an alias, e.g. candidate)")
    pr.add_argument("--alias", default="champion",
                    help="alias to move; the gate compares the version with @champion whichever alias moves")
    pr.add_argument("--reason", required=True, help="why; kept in the audit trail")
    pr.add_argument("--force", action="store_true", help="promote even if the gate says no (recorded)")
    pr.add_argument("--min-improvement", type=float, default=defaults.min_improvement)
    pr.add_argument("--max-regression", type=float, default=defaults.max_regression)
    pr.add_argument("--min-reward", type=float, default=defaults.min_reward)
    pr.add_argument("--significance", type=float, default=defaults.significance,
                    help="family-wise error rate of the per-domain regression tests (Holm-corrected)")

    rb = command("rollback", rollback_cmd, "move an alias back to its previous holder (from the audit trail)")
    rb.add_argument("--alias", default="champion")
    rb.add_argument("--reason", default="rollback")

    h = command("history", history_cmd, "the audit trail of an alias: every promote/rollback, oldest first")
    h.add_argument("--alias", default="champion")
