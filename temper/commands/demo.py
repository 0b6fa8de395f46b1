"""`temper demo` (= `make demo`): the whole post_training flow on the embedded default.

Embedded default: Prefect's ephemeral API, MLflow in sqlite under ./.temper, the local store,
local processes for training (2 ZeRO-3 ranks) and eval, the tiny model. Steps: generate the
starter datasets of the chosen domains, then run flows/post_training.py end to end, then
print the flow run, the before/after table, the registered version and its alias.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from temper.core.errors import TemperError


def demo(args: argparse.Namespace) -> int:
    # Before Prefect is imported: the ephemeral API lives under TEMPER_HOME and may start slowly on 2 busy cores.
    # lazy: pydantic_settings (130 ms), via settings, would load at every `temper` start-up
    from temper.core.settings import get_settings

    settings = get_settings()
    prefect_home(settings)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

    # lazy: pandas+pydantic_settings+fsspec+... (521 ms), via infra.tracking, would load at every `temper` start-up
    from infra.tracking.connection import configure
    from temper.data.catalog import load_catalog, select_domains
    from temper.data.generators import generate_datasets
    from temper.lifecycle.params import PostTrainingParams, load_params

    params = load_params(args.params) if args.params else PostTrainingParams()
    if args.domain:
        params = params.model_copy(update={"domains": args.domain})
    t0 = time.time()
    uri = configure(settings)
    print(f"[demo] tracking {uri}\n[demo] store    {settings.resolved_storage_root}", flush=True)
    def show(r) -> None:
        print(f"[demo] {'wrote' if r.status == 'written' else 'kept ' if r.status == 'kept' else 'FAILED'} "
              f"{r.domain} " + (f"sha256={r.digest[:12]} {r.uri}" if r.status != "failed" else r.error), flush=True)

    catalog = load_catalog(settings.catalog_dir)
    chosen = select_domains(catalog, params.domains + params.held_out)  # held-out ones are evaluated: made too
    if (params.backend or settings.backend) == "local" and settings.sandbox_backend == "bwrap":
        evaluated = select_domains(catalog, params.eval.domains) if params.eval.domains else []
        check_sandbox({d.name: d for d in chosen + evaluated}.values())
    results = generate_datasets(chosen, settings, progress=show)
    if any(r.status == "failed" for r in results):
        print("[demo] some datasets could not be generated (above): nothing was trained")
        return 1

    # lazy: great_expectations+prefect+pandas+... (5.3 s), via post_training, would load at every `temper` start-up
    from flows.post_training import post_training

    state = post_training(params, return_state=True)
    print(f"\n[demo] flow run {state.state_details.flow_run_id}: {state.name} after {time.time() - t0:.0f}s")
    if not state.is_completed():
        print(f"[demo] {state.message}")
        return 1
    result = state.result()
    print("\n" + result["report"])
    reg = result["registered"]
    print(f"\n[demo] registered {reg['name']} version {reg['version']} as @{reg['alias']}")
    print(f"[demo] see it in the MLflow UI: temper up (serves this store), then http://127.0.0.1:5000 -> Models -> "
          f"{reg['name']} -> Version {reg['version']}\n"
          f"[demo] load it (the prompt format it was trained on applied): mlflow.pyfunc.load_model("
          f"'models:/{reg['name']}@{reg['alias']}').predict(['Q: 3 + 4 =\\nA:']); serve it: "
          f"MLFLOW_TRACKING_URI={uri} mlflow models serve --env-manager local -m models:/{reg['name']}@{reg['alias']}")
    return 0


def prefect_home(settings) -> Path:
    """Point Prefect's ephemeral API at ``<TEMPER_HOME>/prefect`` (unless PREFECT_HOME is set) and make
    the folder: Prefect does not make its parents, and with the store and tracking elsewhere (s3://, an
    MLflow server) nothing else creates TEMPER_HOME first; the API then never starts and the flow waits
    out the startup timeout."""
    home = Path(os.environ.setdefault("PREFECT_HOME", str((settings.home / "prefect").resolve())))
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TemperError(f"PREFECT_HOME {home} (under TEMPER_HOME {settings.home}) cannot be created: "
                          f"{e.strerror or e}") from None
    return home


def check_sandbox(domains) -> None:
    """Domains whose verifier runs programs need bubblewrap here: say so before anything is generated or
    trained (the default demo domains, arithmetic and multiplication, do not)."""
    # lazy: the sandbox and verifier registry would load at every `temper` start-up
    from infra.sandbox.bwrap import bwrap_available
    from temper.verifiers.registry import sandbox_profile_of

    sandboxed = sorted(d.name for d in domains
                       if d.sandbox_profile != "none" or sandbox_profile_of(d.verifier.family) != "none")
    if sandboxed and not bwrap_available():
        more = f" (and {len(sandboxed) - 3} more)" if len(sandboxed) > 3 else ""
        raise TemperError(f"domain(s) {', '.join(sandboxed[:3])}{more} score in the sandbox, which needs bubblewrap "
                          "and prlimit: `make system-deps` (or apt-get install -y bubblewrap util-linux)")


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the post_training flow end to end on the embedded default (`make demo`)")
    p.add_argument("--domain", action="append", default=None, metavar="NAME_OR_GLOB", help="override the domains")
    p.add_argument("--params", default=None, help="PostTrainingParams as a YAML/JSON file")
    p.set_defaults(func=demo)
