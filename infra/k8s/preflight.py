"""Before a run's first object: the cluster answers, and the run could ever be admitted.

Each problem here would otherwise surface late and vaguely: an unreachable API server as a
urllib3 retry storm, a missing service account as a Job that silently never gets pods (the Job
controller's FailedCreate events), RBAC as a 403 halfway through creating a Job's objects, a
ResourceQuota smaller than the job as pods that are never created. ``check`` turns each into one
line naming the object and the reason, before anything is created, so there is nothing to clean up.

The decisions (``quota_refusal``, ``demand_of``, ``api_error_line``) are pure functions over the
official client's model objects; ``check`` only makes the reads. A read the caller's own Role
does not allow (403 on a Namespace, 404 on an API the server lacks) means "cannot tell" and is
skipped: the create that follows still fails with a one-line reason (``api_error_line``).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Protocol

import urllib3
from kubernetes import client as k
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from infra.k8s.errors import KubernetesError

# What the launcher calls, as (verb, resource, group, subresource): create/read/delete the Job and
# its headless Service, list the Job's pods, follow their logs, list its FailedCreate Events.
LAUNCHER_VERBS = [("create", "jobs", "batch", None), ("get", "jobs", "batch", None), ("delete", "jobs", "batch", None),
                  ("create", "services", "", None), ("delete", "services", "", None), ("list", "pods", "", None),
                  ("get", "pods", "", "log"), ("list", "events", "", None)]
QUOTA_KEYS = {"requests.cpu", "requests.memory", "limits.cpu", "limits.memory", "cpu", "memory", "pods",
              "requests.nvidia.com/gpu", "count/jobs.batch", "services"}


class PreflightApi(Protocol):
    def version(self) -> str: ...
    def can_i(self, verb: str, resource: str, namespace: str, group: str = "", subresource: str | None = None) -> tuple[bool, str]: ...
    def read_namespace(self, name: str) -> Any: ...
    def read_service_account(self, namespace: str, name: str) -> Any: ...
    def list_resource_quotas(self, namespace: str) -> list[k.V1ResourceQuota]: ...


def _server_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        return str(e.reason)


def api_error_line(e: ApiException, action: str, kind: str, name: str, namespace: str) -> str:
    """One line for a refused create/read: RBAC, a missing namespace, a quota, or the server's own words."""
    said = _server_message(e)
    if e.status == 403 and "exceeded quota" in said:
        return f"{kind} {namespace}/{name}: refused by a ResourceQuota: {said}"
    if e.status == 403:
        return (f"{kind} {namespace}/{name}: RBAC denied {action} ({said}); the identity running the flow needs "
                "the temper-flow-runner Role (k8s/base/rbac.yaml)")
    if e.status == 404 and "namespaces" in said:
        return f"namespace {namespace!r}: not found ({said}); apply k8s/base or set the namespace option"
    return f"{kind} {namespace}/{name}: {action} failed: {e.status} {e.reason}: {said[:300]}"


def demand_of(objects: list[Any]) -> dict[str, Decimal]:
    """What the run's Jobs ask of a namespace at once: pods x per-pod requests/limits, and object counts."""
    total: dict[str, Decimal] = {}

    def add(key: str, amount: Decimal) -> None:
        total[key] = total.get(key, Decimal(0)) + amount

    for obj in objects:
        if isinstance(obj, k.V1Service):
            add("services", Decimal(1))
        if not isinstance(obj, k.V1Job):
            continue
        add("count/jobs.batch", Decimal(1))
        pods = Decimal(obj.spec.parallelism or 1)
        add("pods", pods)
        for c in obj.spec.template.spec.containers:
            res = c.resources or k.V1ResourceRequirements()
            for kind, values in (("requests", res.requests or {}), ("limits", res.limits or {})):
                for resource, q in values.items():
                    add(f"{kind}.{resource}", pods * parse_quantity(q))
                    if kind == "requests" and resource in ("cpu", "memory"):
                        add(resource, pods * parse_quantity(q))  # the bare names quota requests
    return total


def quota_refusal(quotas: list[k.V1ResourceQuota], demand: dict[str, Decimal], job: str) -> str | None:
    """The first ResourceQuota whose hard limit is below what the run needs at once: it can never admit it."""
    for quota in sorted(quotas, key=lambda q: q.metadata.name):
        hard = (quota.status.hard if quota.status and quota.status.hard else None) or (quota.spec.hard if quota.spec else None) or {}
        for key in sorted(set(hard) & set(demand) & QUOTA_KEYS):
            if demand[key] > parse_quantity(hard[key]):
                return (f"ResourceQuota {quota.metadata.namespace}/{quota.metadata.name}: allows {key}={hard[key]} in "
                        f"total, but job {job!r} needs {_fmt(demand[key])} at once; it can never be admitted: "
                        "lower the job's resources or ranks, or raise the quota")
    return None


def _fmt(d: Decimal) -> str:
    return str(d.normalize()) if d == d.to_integral() else f"{d:.3f}"


def _read(fn, *args) -> tuple[Any, ApiException | None]:
    try:
        return fn(*args), None
    except ApiException as e:
        return None, e


def unreachable(host: str, e: BaseException) -> KubernetesError:
    reason = getattr(e, "reason", None) or e
    return KubernetesError(f"Kubernetes API server {host}: not reachable ({type(e).__name__}: {str(reason)[:200]}); "
                           "check the kubeconfig/in-cluster config and that the server runs")


def check(api: PreflightApi, host: str, namespace: str, service_account: str, objects: list[Any],
          extra_verbs: list[tuple[str, str, str, str | None, str]] = ()) -> None:
    """Raise KubernetesError (one line) if the run cannot start; ``extra_verbs`` adds (verb, resource,
    group, subresource, namespace) the run's pods need elsewhere (sandbox pods)."""

    try:
        api.version()
    except ApiException as e:
        if e.status in (401, 403) or e.status is None or e.status >= 500:  # answered, but not as an API server should
            raise KubernetesError(f"Kubernetes API server {host}: answered {e.status} {e.reason} to /version "
                                  "(credentials refused, or not an API server)") from None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise unreachable(host, e) from None
    _, err = _read(api.read_namespace, namespace)
    if err is not None and err.status == 404:
        raise KubernetesError(f"namespace {namespace!r}: not found on {host}; apply k8s/base or set the namespace option")
    _, err = _read(api.read_service_account, namespace, service_account)
    if err is not None and err.status == 404:
        raise KubernetesError(f"service account {namespace}/{service_account}: not found; the run's pods run as it "
                              "(k8s/base/serviceaccounts.yaml) and without it the Job never gets pods")
    needs = [(v, r, g, s, namespace) for v, r, g, s in LAUNCHER_VERBS] + list(extra_verbs)
    for verb, resource, group, sub, ns in needs:
        try:
            allowed, why = api.can_i(verb, resource, ns, group, sub)
        except ApiException:
            break  # no SelfSubjectAccessReview here: the creates say it if RBAC refuses
        if not allowed:
            what = f"{resource}/{sub}" if sub else resource
            raise KubernetesError(f"RBAC denied: may not {verb} {what} in namespace {ns!r}"
                                  f"{f' ({why})' if why else ''}; grant the temper-flow-runner Role (k8s/base/rbac.yaml)")
    quotas, err = _read(api.list_resource_quotas, namespace)
    if quotas:
        jobs = [o.metadata.name for o in objects if isinstance(o, k.V1Job)]
        refusal = quota_refusal(quotas, demand_of(objects), ",".join(jobs))
        if refusal:
            raise KubernetesError(refusal)
