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


def demo(args: argparse.Namespace) -> int:
    # Before Prefect is imported: the ephemeral API lives under TEMPER_HOME and may start slowly on 2 busy cores.
    # lazy: pydantic_settings (130 ms), via settings, would load at every `temper` start-up
    from temper.core.settings import get_settings

    settings = get_settings()
    os.environ.setdefault("PREFECT_HOME", str((settings.home / "prefect").resolve()))
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

    # lazy: pandas+pydantic_settings+fsspec+... (521 ms), via lineage, would load at every `temper` start-up
    from infra import lineage
    from temper.data.catalog import load_catalog, select_domains
    from temper.data.generators import generate_datasets
    from temper.lifecycle.params import PostTrainingParams, load_params

    params = load_params(args.params) if args.params else PostTrainingParams()
    if args.domain:
        params = params.model_copy(update={"domains": args.domain})
    t0 = time.time()
    uri = lineage.configure(settings)
    print(f"[demo] tracking {uri}\n[demo] store    {settings.resolved_storage_root}", flush=True)
    def show(r) -> None:
        print(f"[demo] {'wrote' if r.status == 'written' else 'kept ' if r.status == 'kept' else 'FAILED'} "
              f"{r.domain} " + (f"sha256={r.digest[:12]} {r.uri}" if r.status != "failed" else r.error), flush=True)

    results = generate_datasets(select_domains(load_catalog(settings.catalog_dir), params.domains), settings,
                                progress=show)
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
          f"[demo] load it: mlflow.transformers.load_model('models:/{reg['name']}@{reg['alias']}'); serve it: "
          f"MLFLOW_TRACKING_URI={uri} mlflow models serve --env-manager local -m models:/{reg['name']}@{reg['alias']}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the post_training flow end to end on the embedded default (`make demo`)")
    p.add_argument("--domain", action="append", default=None, metavar="NAME_OR_GLOB", help="override the domains")
    p.add_argument("--params", default=None, help="PostTrainingParams as a YAML/JSON file")
    p.set_defaults(func=demo)
