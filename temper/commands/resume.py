"""`temper resume FLOW_RUN`: continue a post_training run whose flow run died.

Prefect has no heartbeat for a flow run in a local process: a SIGKILLed one stays RUNNING forever.
This command reads the flow run from the Prefect API, refuses what must not be continued (an
unknown id, another flow, a finished run, a run whose process still lives), marks a dead RUNNING
one CRASHED, and runs post_training again in this process with the same parameters (Prefect's record
of them) and ``continues`` set, so the new flow run works under the same run key: finished stages
are skipped, training continues from its newest checkpoint, MLflow records are found, not duplicated
(``temper/lifecycle/resume.py``, ``flows/post_training.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid


def _prefect_api(flow_run: str) -> None:
    """The Prefect API the flow runs live in: TEMPER_PREFECT_API_URL (or PREFECT_API_URL), else the
    embedded one `temper demo` used (its database under TEMPER_HOME). Before Prefect is imported."""
    # lazy: pydantic_settings (130 ms), via settings, would load at every `temper` start-up
    from temper.core.settings import get_settings
    from temper.lifecycle.resume import ResumeError

    settings = get_settings()
    if settings.prefect_api_url:
        os.environ.setdefault("PREFECT_API_URL", settings.prefect_api_url)
    if "PREFECT_API_URL" not in os.environ and "prefect" not in sys.modules:
        home = (settings.home / "prefect").resolve()
        if not (home / "prefect.db").is_file():  # starting the embedded API would create it, empty
            raise ResumeError(f"flow run {flow_run}: no Prefect API configured (TEMPER_PREFECT_API_URL) and no "
                              f"embedded Prefect database at {home / 'prefect.db'}: no flow run ran here")
        os.environ.setdefault("PREFECT_HOME", str(home))
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def resume(args: argparse.Namespace) -> int:
    # lazy: pydantic_settings (130 ms), via resume's settings import, would load at every `temper` start-up
    from temper.lifecycle.resume import ResumeError

    try:
        run_id = str(uuid.UUID(args.flow_run))
    except ValueError:
        raise ResumeError(f"flow run {args.flow_run!r}: not a flow run id (a UUID, as the Prefect UI and "
                          "`prefect flow-run ls` show it)") from None
    _prefect_api(run_id)
    # lazy: prefect+great_expectations+... (5.3 s) would load at every `temper` start-up
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed
    from pydantic import ValidationError

    from temper.core.errors import TemperError, describe_validation_error
    from temper.lifecycle.params import PostTrainingParams
    from temper.lifecycle.resume import check_resumable, origin, process_alive, run_key_of, run_tag

    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(uuid.UUID(run_id))
        except ObjectNotFound:
            raise ResumeError(f"flow run {run_id}: no such flow run in the Prefect API at {client.api_url}") from None
        flow_name = client.read_flow(run.flow_id).name
        state = run.state
        crashed = check_resumable(run_id, flow_name, state.type.value if state else "", state.name if state else "none",
                                  run.infrastructure_pid)
        try:
            params = PostTrainingParams.model_validate((run.parameters or {}).get("params") or {})
        except ValidationError as e:
            raise ResumeError(describe_validation_error(f"flow run {run_id}'s parameters", e)) from None
        first = origin(run_id, run.parameters or {})
        key = run_key_of(first)

        def others(*types: StateType) -> list:  # the other flow runs that worked on the same post_training run
            return [r for r in client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[run_tag(key)]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(types))))) if r.id != run.id]

        if finished := others(StateType.COMPLETED):
            raise ResumeError(f"flow run {run_id}: its post_training run {key} was finished by flow run "
                              f"{finished[0].id}: nothing to resume")
        dead = [run] if crashed else []
        for other in others(StateType.RUNNING, StateType.PENDING):
            if process_alive(other.infrastructure_pid) is not False:
                raise ResumeError(f"flow run {run_id}: its post_training run {key} is being continued by flow run "
                                  f"{other.id} (process {other.infrastructure_pid or 'not recorded'})")
            dead.append(other)
        for r in dead:  # Prefect never hears from a killed process: say what happened to it
            client.set_flow_run_state(r.id, Crashed(message=f"its process {r.infrastructure_pid} is gone "
                                                            "(marked crashed by `temper resume`)"), force=True)
    print(f"[resume] flow run {run_id} was {state.name}{' (its process is gone: marked Crashed)' if crashed else ''}; "
          f"continuing post_training run {key}", flush=True)

    # lazy: great_expectations+prefect+pandas+... (5.3 s), via post_training, would load at every `temper` start-up
    from flows.post_training import post_training

    final = post_training(params, continues=first, return_state=True)
    new_id = final.state_details.flow_run_id
    if not final.is_completed():
        message = (final.message or "").removeprefix("Flow run encountered an exception: ")
        raise TemperError(f"flow run {new_id} {final.name}: {message}; `temper resume {new_id}` continues it")
    reg = final.result()["registered"]
    print(f"[resume] flow run {new_id}: {final.name}; registered {reg['name']} version {reg['version']} "
          f"as @{reg['alias']}", flush=True)
    return 0


def register(sub) -> None:
    p = sub.add_parser("resume", help="continue a post_training run whose flow run died (killed process, outage)")
    p.add_argument("flow_run", metavar="FLOW_RUN", help="id of the post_training flow run to continue")
    p.set_defaults(func=resume)
