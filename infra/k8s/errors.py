"""Errors of Kubernetes runs, each naming the job, the pod and what to change."""

from __future__ import annotations

from temper.core.errors import TemperError


class KubernetesError(TemperError):
    """A manifest cannot be built, or the cluster refused or failed a job."""


class JobFailed(KubernetesError):
    """A Job ended (or was ended by the launcher) without success.

    ``reason`` is one of: OOMKilled, ImagePullBackOff, CreateContainerConfigError, Evicted,
    DeadlineExceeded, Unschedulable, FailedCreate, Inadmissible (Kueue can never admit it), Error
    (non-zero exit), Cancelled, Deleted (the Job vanished while watched). ``retriable`` says
    whether a new attempt (resuming from checkpoint) can help.
    """

    def __init__(self, job: str, reason: str, message: str, retriable: bool, pod: str | None = None):
        self.job, self.reason, self.retriable, self.pod = job, reason, retriable, pod
        where = f"job {job!r}" + (f" pod {pod!r}" if pod else "")
        super().__init__(f"{where}: {reason}: {message}")
