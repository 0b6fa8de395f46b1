"""The thin layer that talks to the API server; everything above it is plain logic.

Each method is one client call, so the launcher's state machine can be tested against a
fake of this class with real model objects (no API server can run in CI). Errors are the
client's own ``ApiException`` (409 AlreadyExists on create, 404 on read/delete).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

import urllib3
import yaml
from kubernetes import client as k
from kubernetes import config
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDIN_CHANNEL

from infra.k8s.errors import KubernetesError

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"  # Kueue >= 0.15 (v1beta1 deprecated since 0.16)
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"  # the label Kueue puts on a Job's Workload


def load_config(context: str | None = None) -> None:
    """In-cluster config when running in a pod (the Prefect worker), else $KUBECONFIG or ~/.kube/config.

    $KUBECONFIG is read now, not when the client was imported (its default location is fixed then).
    """
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, context=context)
        except (config.ConfigException, FileNotFoundError) as e:
            raise KubernetesError(f"no Kubernetes credentials: not in a pod and no usable kubeconfig ({e})") from e


def _reachable(method):
    """A connection failure (no API server there, refused, reset) -> one KubernetesError line naming the server.

    The client raises urllib3's MaxRetryError with a multi-line repr of its connection pool
    otherwise; a generator method (log streaming) is covered up to its first line.
    """
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except urllib3.exceptions.HTTPError as e:
            reason = getattr(e, "reason", None) or e
            raise KubernetesError(f"cannot reach the Kubernetes API server at {self.api_client.configuration.host}: "
                                  f"{' '.join(str(reason).split())[-200:]}") from e
    return call


class ClusterApi:
    """Real calls through the official client. Construct after ``load_config()``."""

    def __init__(self, api_client: k.ApiClient | None = None):
        self.api_client = api_client or k.ApiClient()
        self.batch = k.BatchV1Api(self.api_client)
        self.core = k.CoreV1Api(self.api_client)
        self.net = k.NetworkingV1Api(self.api_client)

    @_reachable
    def create(self, obj: Any) -> Any:
        ns = obj.metadata.namespace
        if isinstance(obj, k.V1Job):
            return self.batch.create_namespaced_job(ns, obj)
        if isinstance(obj, k.V1Service):
            return self.core.create_namespaced_service(ns, obj)
        if isinstance(obj, k.V1Pod):
            return self.core.create_namespaced_pod(ns, obj)
        if isinstance(obj, k.V1NetworkPolicy):
            return self.net.create_namespaced_network_policy(ns, obj)
        raise TypeError(f"cannot create {type(obj).__name__}")

    # --- preflight reads (infra.k8s.preflight) --------------------------------------------
    def version(self) -> str:
        """The server's version: the cheapest call that proves the API server answers."""
        info = k.VersionApi(self.api_client).get_code()
        return f"{info.major}.{info.minor}"

    def can_i(self, verb: str, resource: str, namespace: str, group: str = "", subresource: str | None = None) -> tuple[bool, str]:
        """SelfSubjectAccessReview: may this identity do it? (allowed, the authorizer's reason)."""
        review = k.V1SelfSubjectAccessReview(spec=k.V1SelfSubjectAccessReviewSpec(
            resource_attributes=k.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace, group=group,
                                                       subresource=subresource)))
        status = k.AuthorizationV1Api(self.api_client).create_self_subject_access_review(review).status
        return bool(status.allowed), status.reason or status.evaluation_error or ""

    def read_namespace(self, name: str) -> k.V1Namespace:
        return self.core.read_namespace(name)

    def read_service_account(self, namespace: str, name: str) -> k.V1ServiceAccount:
        return self.core.read_namespaced_service_account(name, namespace)

    def list_resource_quotas(self, namespace: str) -> list[k.V1ResourceQuota]:
        return list(self.core.list_namespaced_resource_quota(namespace).items or [])

    def list_objects(self, namespace: str, label_selector: str) -> list[tuple[str, str]]:
        """(kind, name) of the Jobs, pods and Services carrying ``label_selector``: what cleanup must leave empty."""
        found = [("Job", j.metadata.name) for j in self.batch.list_namespaced_job(namespace, label_selector=label_selector).items]
        found += [("Pod", p.metadata.name) for p in self.core.list_namespaced_pod(namespace, label_selector=label_selector).items]
        found += [("Service", v.metadata.name)
                  for v in self.core.list_namespaced_service(namespace, label_selector=label_selector).items]
        return found

    @_reachable
    def read_job(self, namespace: str, name: str) -> k.V1Job:
        return self.batch.read_namespaced_job(name, namespace)

    @_reachable
    def list_failed_creates(self, namespace: str, job: k.V1Job) -> list[k.CoreV1Event]:
        """The Job controller's FailedCreate Events for this Job (this uid: not an earlier Job of the same name)."""
        selector = (f"involvedObject.kind=Job,involvedObject.name={job.metadata.name},reason=FailedCreate"
                    + (f",involvedObject.uid={job.metadata.uid}" if job.metadata.uid else ""))
        return list(self.core.list_namespaced_event(namespace, field_selector=selector).items or [])

    @_reachable
    def list_workloads(self, namespace: str, job: k.V1Job) -> list[dict]:
        """Kueue's Workloads for this Job (label ``kueue.x-k8s.io/job-uid``), as dicts.

        [] where the cluster has no Kueue (404) or the Role does not grant it (403): the launcher
        then waits for the Job as it did before it read Workloads.
        """
        try:
            found = k.CustomObjectsApi(self.api_client).list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", label_selector=f"{KUEUE_JOB_UID}={job.metadata.uid}")
        except ApiException as e:
            if e.status in (403, 404):
                return []
            raise
        return list(found.get("items") or [])

    @_reachable
    def read_pod(self, namespace: str, name: str) -> k.V1Pod:
        return self.core.read_namespaced_pod(name, namespace)

    @_reachable
    def list_pods(self, namespace: str, label_selector: str) -> list[k.V1Pod]:
        return list(self.core.list_namespaced_pod(namespace, label_selector=label_selector).items or [])

    @_reachable
    def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete, cascading to pods; a missing object is not an error (cleanup is idempotent)."""
        body = k.V1DeleteOptions(propagation_policy="Background", grace_period_seconds=None)
        try:
            if kind == "Job":
                self.batch.delete_namespaced_job(name, namespace, body=body)
            elif kind == "Service":
                self.core.delete_namespaced_service(name, namespace)
            elif kind == "Pod":
                self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            else:
                raise TypeError(f"cannot delete {kind}")
        except ApiException as e:
            if e.status != 404:
                raise

    def stream_log(self, namespace: str, pod: str, container: str) -> Iterator[str]:
        """Follow a container's log line by line until it exits."""
        resp = self.core.read_namespaced_pod_log(pod, namespace, container=container, follow=True,
                                                 _preload_content=False)
        buf = b""
        try:
            for chunk in resp.stream(4096):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
            if buf:
                yield buf.decode("utf-8", "replace")
        finally:
            resp.release_conn()

    def exec(self, namespace: str, pod: str, container: str, argv: list[str], stdin: bytes | None,
             timeout_s: float) -> tuple[int | None, bytes, bytes]:
        """Run ``argv`` in a container over the exec websocket: (exit code or None on timeout, stdout, stderr).

        Closing stdin needs the v5 channel protocol (Kubernetes >= 1.30); on older servers a
        program reading stdin to EOF waits until the timeout (the sandbox executor reads a
        length-prefixed request instead, so it never waits for EOF). A failure of the exec
        itself (no such executable, container gone) raises KubernetesError with the server's words.
        """
        # lazy: websocket (20 ms) would load in fast unit tests (test_k8s_failures.py)
        from websocket import WebSocketException

        # Its own ApiClient: ``stream`` swaps the client's ``call_api`` for the websocket one while it connects
        # and puts it back after, on the client object, for every thread. On the shared client, a delete or
        # read from another thread meanwhile went out as a websocket handshake ("Handshake status 200 OK"),
        # and two execs connecting at once could leave the swap in place for good, so every later call of the
        # process failed: a sandbox pool's pods outlived its eval/training pod (their deletes failed).
        exec_client = k.ApiClient(self.api_client.configuration)
        try:
            ws = stream(k.CoreV1Api(exec_client).connect_get_namespaced_pod_exec, pod, namespace, container=container,
                        command=argv, stdin=stdin is not None, stdout=True, stderr=True, tty=False,
                        binary=True, _preload_content=False)
        finally:
            exec_client.close()  # its HTTP pool only: the websocket is its own connection
        try:
            if stdin is not None:
                ws.write_stdin(stdin)
                ws.close_channel(STDIN_CHANNEL)
            ws.run_forever(timeout=timeout_s)
            timed_out = ws.is_open()
            # timeout=0: never block on a connection that is still open (the timed-out case)
            out, err = ws.read_stdout(timeout=0) or b"", ws.read_stderr(timeout=0) or b""
            status = None if timed_out else ws.read_channel(ERROR_CHANNEL, timeout=0)
        except (WebSocketException, OSError) as e:
            raise KubernetesError(f"exec in pod {pod!r}: connection failed: {e}") from e
        finally:
            ws.close()
        return (None if timed_out else exec_exit_code(status, pod)), bytes(out), bytes(err)


def exec_exit_code(status: bytes | str | None, pod: str) -> int:
    """The exit code from the exec status channel (a metav1.Status document).

    Success -> 0; Failure/NonZeroExitCode -> the code in details.causes[ExitCode]; any other
    Failure (executable not found, container not running) or no status at all -> KubernetesError.
    """
    doc = yaml.safe_load(status) if status else None
    doc = doc if isinstance(doc, dict) else {}
    if doc.get("status") == "Success":
        return 0
    for cause in (doc.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause["message"])
    message = doc.get("message")
    raise KubernetesError(f"exec in pod {pod!r} failed: {message or 'the connection closed without an exit status'}")
