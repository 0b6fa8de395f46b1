"""Prefect events temper emits: a dataset write that changed a digest -> `temper.dataset.changed`.

The `retrain` deployment (prefect.yaml) carries a trigger on this event, so new data starts a
retrain without waiting for the nightly cron, and the Prefect UI shows the event as the reason.
The library (temper/data/datasets.py) only calls listeners; the entry points that write data
(`temper data generate`) collect the changes and hand them to :func:`emit_dataset_changes`.

Events go to the configured Prefect API (PREFECT_API_URL). Without one there is nobody to
hear them: Prefect would start an ephemeral server just to drop the event, so none is sent.
"""

from __future__ import annotations

from prefect.events import Event, emit_event
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL

from temper.data.datasets import DatasetChange

DATASET_CHANGED = "temper.dataset.changed"


def resource_id(domain: str) -> str:
    return f"temper.dataset.{domain}"


def emit_dataset_changed(change: DatasetChange) -> Event | None:
    """One event per changed domain; the resource is the domain's dataset, the payload its digests."""
    if not PREFECT_API_URL.value():
        return None
    return emit_event(event=DATASET_CHANGED,
                      resource={"prefect.resource.id": resource_id(change.domain),
                                "prefect.resource.name": change.domain, "temper.domain": change.domain},
                      payload={"uri": change.uri, "previous_sha256": change.previous, "sha256": change.sha256})


def emit_dataset_changes(changes: list[DatasetChange], timeout_s: float = 10) -> list[Event]:
    """Emit one event per change and wait until they are sent (a CLI process exits right after)."""
    sent = [e for e in map(emit_dataset_changed, changes) if e is not None]
    if sent:
        EventsWorker.drain_all(timeout=timeout_s, at_exit=False)
    return sent
