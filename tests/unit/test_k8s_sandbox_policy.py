"""The sandbox namespace's admission policy: committed as rendered, schema-valid, and its CEL rules
evaluated (cel-python, the CEL spec's Python implementation) against real pod manifests: the pod
``KubernetesBackend`` creates passes every rule, and each way out of the box is refused by its rule."""

from __future__ import annotations

import celpy
import kubernetes_validate
import pytest
import yaml

from infra.k8s import manifests as m
from infra.k8s.options import KubernetesOptions
from infra.k8s.sandbox_policy import POLICY, VALIDATIONS, admission_policy, sandbox_objects
from tests.unit.test_k8s_static import K8S, restricted_violations

OPTS = KubernetesOptions(sandbox_namespace="temper-sandbox")  # as k8s/base/options-configmap.yaml
USER = "system:serviceaccount:temper:temper-workload"


def _program(expression: str):
    env = celpy.Environment()
    return env.program(env.compile(expression))


def refused(pod: dict, user: str = USER) -> list[str]:
    """The messages of the rules that refuse ``pod`` when ``user`` creates it (as the API server would)."""
    spec = m.to_dict(admission_policy(OPTS))["spec"]
    request = celpy.json_to_cel({"userInfo": {"username": user}})
    if not all(_program(c["expression"]).evaluate({"request": request}) for c in spec["matchConditions"]):
        return []  # the policy does not apply to this requester
    obj = celpy.json_to_cel(pod)
    return [v["message"] for v in spec["validations"] if not _program(v["expression"]).evaluate({"object": obj})]


def sandbox_pod() -> dict:
    return m.to_dict(m.sandbox_pod("sandbox-abc", OPTS, 600))


def test_committed_file_is_what_render_sandbox_writes(tmp_path):
    from temper.cli import main

    out = tmp_path / "sandbox.yaml"
    assert main(["k8s", "render-sandbox", "--out", str(out)]) == 0
    assert (K8S / "base/sandbox.yaml").read_text() == out.read_text()


def test_the_cluster_options_name_the_rendered_sandbox_namespace(tmp_path):
    from infra.k8s.options import load_options

    cm = yaml.safe_load((K8S / "base/options-configmap.yaml").read_text())
    (tmp_path / "o.yaml").write_text(cm["data"]["options.yaml"])
    assert load_options(tmp_path / "o.yaml").sandbox_ns == OPTS.sandbox_ns != OPTS.namespace


def test_objects_validate_strictly_and_the_namespace_is_restricted():
    docs = [m.to_dict(o) for o in sandbox_objects(OPTS)]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.33", strict=True)
    ns = next(d for d in docs if d["kind"] == "Namespace")
    assert ns["metadata"]["name"] == OPTS.sandbox_ns
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == POLICY and binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": OPTS.sandbox_ns}


def test_the_backends_sandbox_pod_passes_every_rule_and_pod_security_restricted():
    pod = sandbox_pod()
    assert pod["metadata"]["namespace"] == OPTS.sandbox_ns
    assert refused(pod) == []
    assert restricted_violations(pod["spec"]) == []


def _mutate(path: list, value):
    pod = sandbox_pod()
    node = pod
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return pod


ESCAPES = {
    "hostPath volume": (["spec", "volumes"], [{"name": "root", "hostPath": {"path": "/"}}], "emptyDir volumes only"),
    "a Secret volume": (["spec", "volumes"], [{"name": "s", "secret": {"secretName": "temper-s3"}}], "emptyDir volumes only"),
    "no sandbox label": (["metadata", "labels"], {"app": "x"}, "must carry the label"),
    "token mounted": (["spec", "automountServiceAccountToken"], True, "automountServiceAccountToken"),
    "host network": (["spec", "hostNetwork"], True, "node's network"),
    "init container": (["spec", "initContainers"], [{"name": "i", "image": "x"}], "init or ephemeral"),
    "no deadline": (["spec", "activeDeadlineSeconds"], None, "activeDeadlineSeconds"),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_each_escape_is_refused_by_its_rule(case):
    path, value, words = ESCAPES[case]
    (message,) = refused(_mutate(path, value))
    assert words in message


@pytest.mark.parametrize("change", ["privileged", "root", "escalation", "caps_add", "writable_root", "no_limits"])
def test_container_escapes_are_refused(change):
    pod = sandbox_pod()
    c = pod["spec"]["containers"][0]
    sc = c["securityContext"]
    {"privileged": lambda: sc.update(privileged=True), "root": lambda: sc.update(runAsNonRoot=False),
     "escalation": lambda: sc.update(allowPrivilegeEscalation=True),
     "caps_add": lambda: sc["capabilities"].update(add=["SYS_ADMIN"]),
     "writable_root": lambda: sc.update(readOnlyRootFilesystem=False),
     "no_limits": lambda: c["resources"].pop("limits")}[change]()
    (message,) = refused(pod)
    assert "sandbox containers must" in message


def test_the_policy_applies_to_the_workloads_account_only():
    bad = _mutate(["spec", "volumes"], [{"name": "root", "hostPath": {"path": "/"}}])
    assert refused(bad) and refused(bad, user="system:serviceaccount:temper:temper-flow-runner") == []


def test_every_rule_is_a_compilable_expression_with_a_message():
    for expression, message in VALIDATIONS:
        _program(expression)
        assert message and len(message) < 120
