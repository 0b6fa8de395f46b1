"""Continuing a post_training run whose flow run died: the run key and which flow runs may be continued.

A post_training run is identified by its *run key*, ``pt-<first 8 hex of the flow run that started
it>``. Everything the run leaves behind is found by that key: the training jobs' checkpoints (run
name ``<key>-<stage>``, under ``<store>/runs`` and ``TEMPER_HOME/runs/<key>``), the lifecycle run
and every stage's MLflow record (tag ``temper.record``), the registered version (tagged with the
lifecycle run). `temper resume FLOW_RUN` starts a new flow run with the dead one's parameters and
``continues`` = the key's flow run, so the new run works under the same key: each stage finds its
finished output and skips, or continues from its newest checkpoint.

Plain functions over what the Prefect API returns (no Prefect import): the CLI command reads the
flow run, these decide.
"""

from __future__ import annotations

import os
import socket

from temper.core.errors import TemperError

FLOW_NAME = "post_training"
# Prefect state types a flow run can be continued from: it ended without finishing, or it claims to
# run but its process is gone (a SIGKILLed process never reports; Prefect marks nothing crashed).
ENDED = {"FAILED", "CRASHED", "CANCELLED"}
MAYBE_RUNNING = {"RUNNING", "PENDING", "CANCELLING"}


class ResumeError(TemperError):
    """The flow run named cannot be continued (unknown, finished, another flow, still alive)."""


def run_key_of(flow_run_id: str | None, continues: str | None = None) -> str:
    """The run key of a flow run: that of the run it continues, else its own."""
    return f"pt-{str(continues or flow_run_id or 'local')[:8]}"


def run_tag(key: str) -> str:
    """The Prefect tag on every flow run that worked on the run ``key``."""
    return f"temper-run:{key}"


def origin(flow_run_id: str, parameters: dict) -> str:
    """The flow run whose key a continuation keeps: the one a continued run itself continued, else itself."""
    return parameters.get("continues") or flow_run_id


def process_tag() -> str:
    """``host:pid`` of this process: recorded on the flow run (Prefect's ``infrastructure_pid``, in the
    process worker's format), so `temper resume` can tell whether a RUNNING flow run's process is gone."""
    return f"{socket.gethostname()}:{os.getpid()}"


def process_alive(tag: str | None) -> bool | None:
    """Whether the ``host:pid`` process still runs: None when it cannot be told from here (no tag, a tag
    of another format, or another host)."""
    if not tag or ":" not in tag:
        return None
    host, _, pid = tag.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_resumable(flow_run_id: str, flow_name: str, state_type: str, state_name: str, process: str | None) -> bool:
    """Raise ResumeError when the flow run must not be continued; True when it must first be marked
    CRASHED (Prefect still shows it running, but its process is gone)."""
    if flow_name != FLOW_NAME:
        raise ResumeError(f"flow run {flow_run_id} is a run of flow {flow_name!r}: only {FLOW_NAME} runs can be resumed")
    if state_type == "COMPLETED":
        raise ResumeError(f"flow run {flow_run_id} finished ({state_name}): nothing to resume")
    if state_type in ENDED:
        return False
    if state_type in MAYBE_RUNNING:
        alive = process_alive(process)
        if alive is False:
            return True
        if alive:
            raise ResumeError(f"flow run {flow_run_id} is {state_name} and its process {process} is alive: "
                              "stop it (or cancel the flow run) before resuming it")
        raise ResumeError(f"flow run {flow_run_id} is {state_name} and its process ({process or 'not recorded'}) "
                          "cannot be checked from this machine: cancel the flow run in Prefect, then resume it")
    raise ResumeError(f"flow run {flow_run_id} is {state_name}: not a run that stopped, nothing to resume")
