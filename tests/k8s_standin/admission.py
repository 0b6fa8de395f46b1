"""What kube-apiserver does to an object on create, before it is stored: defaults and admission.

Imitated, because temper's failure messages depend on them:

- Job defaulting/validation (batch/v1 registry strategy): ``parallelism``/``completions``/
  ``backoffLimit``/``completionMode``/``suspend`` defaults, the generated selector and the
  ``batch.kubernetes.io/controller-uid`` + ``job-name`` template labels, Indexed needs
  ``completions``, a ``podFailurePolicy`` needs ``restartPolicy: Never``;
- the ServiceAccount admission plugin: a pod naming a service account that does not exist is
  refused (403), and each new namespace gets its ``default`` account (the service-account
  controller's job, done synchronously here);
- Priority and RuntimeClass admission: an unknown ``priorityClassName`` or ``runtimeClassName``
  is refused (403);
- ResourceQuota admission: a pod whose requests/limits would push the namespace past a quota's
  ``hard`` amounts (``requests.cpu``, ``requests.memory``, ``limits.cpu``, ``limits.memory``,
  ``pods``, and object counts ``count/<resource>``) is refused (403 ``exceeded quota``), counting
  non-terminal pods like the quota controller.

Cut: no RBAC/authentication (every request is allowed), no Pod Security admission, no
ValidatingAdmissionPolicy or webhooks, no LimitRange defaulting.
"""

from __future__ import annotations

from kubernetes.utils import parse_quantity

from tests.k8s_standin.store import ApiError, Store

CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"


def pod_amounts(pod: dict, what: str) -> dict[str, float]:
    """Sum of container ``requests`` or ``limits`` (requests default to limits, as the API does)."""
    total: dict[str, float] = {}
    for c in pod.get("spec", {}).get("containers", []):
        res = c.get("resources") or {}
        amounts = res.get(what) or (res.get("limits") if what == "requests" else None) or {}
        for key, val in amounts.items():
            total[key] = total.get(key, 0) + float(parse_quantity(val))
    return total


def _forbidden(pod: dict, why: str) -> ApiError:
    name = pod["metadata"].get("name") or pod["metadata"].get("generateName", "")
    return ApiError(403, "Forbidden", f'pods "{name}" is forbidden: {why}', "pods", name)


def admit_pod(store: Store, namespace: str, pod: dict) -> None:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("schedulerName", "default-scheduler")
    if not spec.get("containers"):
        raise ApiError(422, "Invalid", f'Pod "{pod["metadata"].get("name")}" is invalid: spec.containers: Required value')
    sa = spec["serviceAccountName"]
    if store.find("ServiceAccount", namespace, sa) is None and store.find("Namespace", "", namespace) is not None:
        raise _forbidden(pod, f'error looking up service account {namespace}/{sa}: serviceaccount "{sa}" not found')
    pc = spec.get("priorityClassName")
    if pc:
        cls = store.find("PriorityClass", "", pc)
        if cls is None:
            raise _forbidden(pod, f"no PriorityClass with name {pc} was found")
        spec["priority"] = cls.get("value", 0)
    rc = spec.get("runtimeClassName")
    if rc and store.find("RuntimeClass", "", rc) is None:
        raise _forbidden(pod, f'pod rejected: RuntimeClass "{rc}" not found')
    _check_quota(store, namespace, pod)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod)}


def qos_class(pod: dict) -> str:
    """Guaranteed: cpu and memory limits == requests in every container; BestEffort: none set."""
    res = [c.get("resources") or {} for c in pod["spec"]["containers"]]
    if not any(r.get("requests") or r.get("limits") for r in res):
        return "BestEffort"
    guaranteed = all((r.get("limits") or {}).get(x) and (r.get("requests") or r.get("limits") or {}).get(x)
                     == r["limits"][x] for r in res for x in ("cpu", "memory"))
    return "Guaranteed" if guaranteed else "Burstable"


def _check_quota(store: Store, namespace: str, pod: dict) -> None:
    live = [p for p in store.list("Pod", namespace) if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
    for quota in store.list("ResourceQuota", namespace):
        hard = quota.get("spec", {}).get("hard") or {}
        over, used_s, req_s = [], [], []
        for key, limit in sorted(hard.items()):
            if key == "pods":
                used, want = len(live), 1
            elif key.split(".", 1)[0] in ("requests", "limits") or key in ("cpu", "memory"):
                what, res = key.split(".", 1) if "." in key else ("requests", key)
                used = sum(pod_amounts(p, what).get(res, 0) for p in live)
                want = pod_amounts(pod, what).get(res, 0)
            else:
                continue
            if used + want > float(parse_quantity(limit)):
                over.append(f"{key}={limit}")
                used_s.append(f"{key}={used:g}")
                req_s.append(f"{key}={want:g}")
        if over:
            raise _forbidden(pod, f"exceeded quota: {quota['metadata']['name']}, requested: {','.join(req_s)}, "
                             f"used: {','.join(used_s)}, limited: {','.join(over)}")


def check_object_count(store: Store, namespace: str, kind: str, name: str) -> None:
    """ResourceQuota ``count/<resource>`` (e.g. ``count/jobs.batch``): one more object must fit."""
    from tests.k8s_standin.store import BY_NAME

    resource = BY_NAME[kind].resource
    for quota in store.list("ResourceQuota", namespace):
        limit = (quota.get("spec", {}).get("hard") or {}).get(f"count/{resource}")
        used = len(store.list(kind, namespace))
        if limit is not None and used + 1 > float(parse_quantity(limit)):
            raise ApiError(403, "Forbidden", f'{resource} "{name}" is forbidden: exceeded quota: '
                           f"{quota['metadata']['name']}, requested: count/{resource}=1, used: count/{resource}={used}, "
                           f"limited: count/{resource}={limit}", kind, name)


def admit_job(job: dict) -> None:
    meta, spec = job["metadata"], job.setdefault("spec", {})
    name = meta.get("name", "")
    mode = spec.setdefault("completionMode", "NonIndexed")
    if mode == "Indexed" and spec.get("completions") is None:
        raise ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: spec.completions: Required value: '
                       "when completion mode is Indexed", "Job", name)
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    template = spec.setdefault("template", {})
    restart = template.setdefault("spec", {}).get("restartPolicy")
    if restart not in ("Never", "OnFailure"):
        raise ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: spec.template.spec.restartPolicy: '
                       f'Unsupported value: "{restart}": supported values: "OnFailure", "Never"', "Job", name)
    if spec.get("podFailurePolicy") and restart != "Never":
        raise ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: spec.template.spec.restartPolicy: '
                       'Invalid value: only "Never" is supported when podFailurePolicy is specified', "Job", name)
    labels = {CONTROLLER_UID: meta["uid"], JOB_NAME: name, "controller-uid": meta["uid"], "job-name": name}
    spec["selector"] = {"matchLabels": {CONTROLLER_UID: meta["uid"]}}
    tmeta = template.setdefault("metadata", {})
    tmeta["labels"] = {**(tmeta.get("labels") or {}), **labels}
    job.setdefault("status", {})
