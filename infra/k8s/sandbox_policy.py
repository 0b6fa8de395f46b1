"""The sandbox namespace: what training/eval pods may create there, and nothing more.

Verifiers inside training and eval pods (GRPO's reward function, eval's code/terminal domains)
run untrusted programs in sandbox pods (``infra.sandbox.kubernetes``), so the workloads' service
account needs ``pods create``. RBAC cannot restrict a create by the object's content, and a
token that may create any pod could create a privileged one or mount the node's disk. So:

- sandbox pods live in their own namespace (``KubernetesOptions.sandbox_namespace``), with Pod
  Security "restricted" enforced and a deny-all NetworkPolicy;
- the workloads' Role there grants only what ``KubernetesBackend`` calls (pods create/get/delete,
  pods/exec), and a ResourceQuota bounds how many pods it can hold;
- a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, Kubernetes >= 1.30) bound to that
  namespace rejects, for requests by that service account, any pod that is not what
  ``manifests.sandbox_pod`` builds: the sandbox label, only emptyDir volumes (no hostPath, no
  Secrets, no projected token), no token automount, no host namespaces, no init or ephemeral
  containers, every container non-root, read-only root, no privilege escalation, ALL capabilities
  dropped and none added, CPU and memory limits, and a deadline.

``sandbox_objects`` builds them; ``temper k8s render-sandbox`` writes them into the kustomize tree
(``k8s/base/sandbox.yaml``), and a test checks the committed file is exactly this output.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k

from infra.k8s import manifests as m
from infra.k8s.options import KubernetesOptions

POLICY = "temper-sandbox-pods"

# CEL over the admission request's ``object`` (a Pod); each message names what was refused.
VALIDATIONS: list[tuple[str, str]] = [
    (f"has(object.metadata.labels) && '{m.ROLE_LABEL}' in object.metadata.labels && "
     f"object.metadata.labels['{m.ROLE_LABEL}'] == '{m.SANDBOX_ROLE}'",
     f"sandbox pods must carry the label {m.ROLE_LABEL}={m.SANDBOX_ROLE}"),
    ("!has(object.spec.volumes) || object.spec.volumes.all(v, has(v.emptyDir))",
     "sandbox pods may mount emptyDir volumes only (no hostPath, Secret, ConfigMap, projected or PVC)"),
    ("has(object.spec.automountServiceAccountToken) && object.spec.automountServiceAccountToken == false",
     "sandbox pods must set automountServiceAccountToken: false"),
    ("!(has(object.spec.hostNetwork) && object.spec.hostNetwork) && !(has(object.spec.hostPID) && object.spec.hostPID)"
     " && !(has(object.spec.hostIPC) && object.spec.hostIPC)",
     "sandbox pods may not share the node's network, PID or IPC namespace"),
    ("!has(object.spec.initContainers) && !has(object.spec.ephemeralContainers)",
     "sandbox pods may not have init or ephemeral containers"),
    ("has(object.spec.activeDeadlineSeconds)", "sandbox pods must set activeDeadlineSeconds"),
    ("object.spec.containers.all(c, has(c.securityContext) && has(c.securityContext.runAsNonRoot) && "
     "c.securityContext.runAsNonRoot == true && has(c.securityContext.readOnlyRootFilesystem) && "
     "c.securityContext.readOnlyRootFilesystem == true && has(c.securityContext.allowPrivilegeEscalation) && "
     "c.securityContext.allowPrivilegeEscalation == false && !(has(c.securityContext.privileged) && "
     "c.securityContext.privileged) && has(c.securityContext.capabilities) && "
     "has(c.securityContext.capabilities.drop) && 'ALL' in c.securityContext.capabilities.drop && "
     "!has(c.securityContext.capabilities.add))",
     "sandbox containers must run non-root, read-only root, no privilege escalation, all capabilities dropped"),
    ("object.spec.containers.all(c, has(c.resources) && has(c.resources.limits) && "
     "'cpu' in c.resources.limits && 'memory' in c.resources.limits)",
     "sandbox containers must set CPU and memory limits"),
]


def _namespace_selector(namespace: str) -> k.V1LabelSelector:
    return k.V1LabelSelector(match_labels={"kubernetes.io/metadata.name": namespace})


def admission_policy(opts: KubernetesOptions) -> k.V1ValidatingAdmissionPolicy:
    user = f"system:serviceaccount:{opts.namespace}:{opts.service_account}"
    return k.V1ValidatingAdmissionPolicy(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicy",
        metadata=k.V1ObjectMeta(name=POLICY, labels=dict(m.PART_OF)),
        spec=k.V1ValidatingAdmissionPolicySpec(
            failure_policy="Fail",
            match_constraints=k.V1MatchResources(
                namespace_selector=_namespace_selector(opts.sandbox_ns),
                resource_rules=[k.V1NamedRuleWithOperations(api_groups=[""], api_versions=["v1"],
                                                            operations=["CREATE", "UPDATE"], resources=["pods"])]),
            match_conditions=[k.V1MatchCondition(name="workload-service-account",
                                                 expression=f"request.userInfo.username == '{user}'")],
            validations=[k.V1Validation(expression=expr, message=msg, reason="Forbidden") for expr, msg in VALIDATIONS],
        ),
    )


def admission_binding(opts: KubernetesOptions) -> k.V1ValidatingAdmissionPolicyBinding:
    return k.V1ValidatingAdmissionPolicyBinding(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicyBinding",
        metadata=k.V1ObjectMeta(name=POLICY, labels=dict(m.PART_OF)),
        spec=k.V1ValidatingAdmissionPolicyBindingSpec(
            policy_name=POLICY, validation_actions=["Deny"],
            match_resources=k.V1MatchResources(namespace_selector=_namespace_selector(opts.sandbox_ns))),
    )


REAPER_ROLE = "temper-sandbox-reaper"
FLOW_RUNNER_ACCOUNT = "temper-flow-runner"  # k8s/base/serviceaccounts.yaml: the flow-run pods, the launcher's identity


def sandbox_objects(opts: KubernetesOptions) -> list[Any]:
    """Namespace, NetworkPolicy, Role + RoleBinding for the workloads, ResourceQuota, admission policy + binding."""
    ns, meta = opts.sandbox_ns, dict(m.PART_OF)
    role = "temper-sandbox-creator"
    return [
        k.V1Namespace(api_version="v1", kind="Namespace", metadata=k.V1ObjectMeta(name=ns, labels={
            **meta, "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest", "pod-security.kubernetes.io/warn": "restricted"})),
        m.sandbox_network_policy(ns),
        k.V1Role(api_version="rbac.authorization.k8s.io/v1", kind="Role",
                 metadata=k.V1ObjectMeta(name=role, namespace=ns, labels=meta),
                 rules=[k.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["create", "get", "delete"]),
                        k.V1PolicyRule(api_groups=[""], resources=["pods/exec"], verbs=["create", "get"])]),
        k.V1RoleBinding(api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding",
                        metadata=k.V1ObjectMeta(name=role, namespace=ns, labels=meta),
                        subjects=[k.RbacV1Subject(kind="ServiceAccount", name=opts.service_account,
                                                  namespace=opts.namespace)],
                        role_ref=k.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=role)),
        # the launcher (in the flow-run pods) deletes the sandbox pods a job left (KubernetesLauncher.reap_sandboxes)
        k.V1Role(api_version="rbac.authorization.k8s.io/v1", kind="Role",
                 metadata=k.V1ObjectMeta(name=REAPER_ROLE, namespace=ns, labels=meta),
                 rules=[k.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list", "delete"])]),
        k.V1RoleBinding(api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding",
                        metadata=k.V1ObjectMeta(name=REAPER_ROLE, namespace=ns, labels=meta),
                        subjects=[k.RbacV1Subject(kind="ServiceAccount", name=FLOW_RUNNER_ACCOUNT,
                                                  namespace=opts.namespace)],
                        role_ref=k.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=REAPER_ROLE)),
        k.V1ResourceQuota(api_version="v1", kind="ResourceQuota",
                          metadata=k.V1ObjectMeta(name="temper-sandbox", namespace=ns, labels=meta),
                          spec=k.V1ResourceQuotaSpec(hard={"pods": "32", "limits.cpu": "32", "limits.memory": "64Gi"})),
        admission_policy(opts),
        admission_binding(opts),
    ]
