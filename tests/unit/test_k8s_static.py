"""Static manifests (k8s/): every kustomization renders, every object validates against the real
API schema (1.33, strict), and the policies hold: least-privilege Roles, Pod Security
"restricted", resources on every container, no credential in the repo, references that resolve,
jobs that fit the overlay they are meant for, and a Prefect base job template that works in a
restricted namespace.

No cluster runs here. The overlays are rendered by a small Python kustomize (resources,
namespace, labels, secretGenerator, strategic-merge patches by kind/name: the features these
kustomizations use, and it refuses others); where ``kubectl`` is installed, the same
kustomizations are also rendered by its built-in kustomize and must give the same objects.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from infra.k8s import manifests as m
from infra.k8s.options import KubernetesOptions, load_options
from infra.k8s.render import load_render_config, render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUSTOMIZATIONS = ["base", "overlays/dev", "overlays/gpu-cluster"]
SCHEMA = "1.33"
CLUSTER_SCOPED = {"Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding", "StorageClass", "RuntimeClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterQueue", "ResourceFlavor"}
KUEUE_API = "kueue.x-k8s.io/"  # custom resources: validated against Kueue's CRDs in test_k8s_kueue.py
SUPPORTED = {"apiVersion", "kind", "namespace", "labels", "resources", "patches", "secretGenerator",
             "generatorOptions", "images"}
# Strategic-merge keys of the lists these patches touch (from the Kubernetes API's patchMergeKey).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "ports": "containerPort"}
# Secrets the operator creates by hand on that cluster (docs/kubernetes.md), never in the repo.
OPERATOR_SECRETS = {"overlays/gpu-cluster": {"temper-mlflow"}, "base": {"temper-mlflow"},
                    "overlays/dev": {"temper-s3"}}  # MinIO's root credentials are the S3 secret's keys
# Which overlay each job config is written for: it must be admissible there.
CONFIG_TARGETS = {"sft-zero3-cpu.yaml": "overlays/dev", "sandbox-batch.yaml": "overlays/dev",
                  "sft-zero3-gpu.yaml": "overlays/gpu-cluster", "eval-shards.yaml": "overlays/gpu-cluster"}


# --- a small kustomize --------------------------------------------------------------------------
def _smp(base: dict, patch: dict) -> None:
    """Strategic merge: maps merge, listed lists merge by key, null deletes, anything else replaces."""
    for key, val in patch.items():
        if val is None:
            base.pop(key, None)
        elif isinstance(val, dict) and isinstance(base.get(key), dict):
            _smp(base[key], val)
        elif isinstance(val, list) and isinstance(base.get(key), list) and key in MERGE_KEYS:
            merge_key = MERGE_KEYS[key]
            for item in val:
                match = next((b for b in base[key] if b.get(merge_key) == item.get(merge_key)), None)
                if match is None:
                    base[key].append(copy.deepcopy(item))
                else:
                    _smp(match, item)
        else:
            base[key] = copy.deepcopy(val)


def kustomize(path: Path) -> list[dict]:
    kz = yaml.safe_load((path / "kustomization.yaml").read_text())
    unsupported = set(kz) - SUPPORTED
    assert not unsupported, f"{path}: this renderer does not implement {unsupported}"
    docs: list[dict] = []
    for res in kz.get("resources", []):
        target = path / res
        docs += kustomize(target) if target.is_dir() else [d for d in yaml.safe_load_all(target.read_text()) if d]
    for gen in kz.get("secretGenerator", []):
        assert kz.get("generatorOptions", {}).get("disableNameSuffixHash"), "hashed names are not implemented"
        data = dict(lit.split("=", 1) for lit in gen["literals"])
        meta = {"name": gen["name"], **({"namespace": gen["namespace"]} if "namespace" in gen else {})}
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
                     "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})
    for patch in kz.get("patches", []):
        body = yaml.safe_load((path / patch["path"]).read_text())
        targets = [d for d in docs if d["kind"] == body["kind"] and d["metadata"]["name"] == body["metadata"]["name"]]
        assert len(targets) == 1, f"{path}/{patch['path']}: patch target {body['kind']}/{body['metadata']['name']} " \
                                  f"matches {len(targets)} objects"
        _smp(targets[0], body)
    for image in kz.get("images", []):  # what `kustomize edit set image` writes
        for doc in docs:
            for pod in pod_specs(doc):
                for c in containers(pod):
                    if c["image"].split(":")[0] == image["name"]:
                        tag = image.get("newTag", c["image"].partition(":")[2])
                        c["image"] = image.get("newName", image["name"]) + (f":{tag}" if tag else "")
    for doc in docs:
        if kz.get("namespace") and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = kz["namespace"]
        for label in kz.get("labels", []):
            doc["metadata"].setdefault("labels", {}).update(label["pairs"])
    return docs


def _key(doc: dict) -> tuple:
    return doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]


def find(docs: list[dict], kind: str, name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_specs(doc: dict) -> list[dict]:
    if doc["kind"] == "Pod":
        return [doc["spec"]]
    if doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return [doc["spec"]["template"]["spec"]]
    return []


def containers(pod: dict) -> list[dict]:
    return pod.get("initContainers", []) + pod["containers"]


RENDERED = {name: kustomize(K8S / name) for name in KUSTOMIZATIONS}


def restricted_violations(pod: dict) -> list[str]:
    """Pod Security Standard 'restricted' (what the namespace label enforces), for one pod spec."""
    bad = []
    psc = pod.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            bad.append(flag)
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
    for vol in pod.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= allowed_volumes:
            bad.append(f"volume {vol['name']}: {kinds - allowed_volumes}")
    for c in containers(pod):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{c['name']}: allowPrivilegeEscalation must be false")
        if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
            bad.append(f"{c['name']}: capabilities must drop ALL")
        if set((sc.get("capabilities") or {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{c['name']}: adds capabilities")
        if sc.get("privileged"):
            bad.append(f"{c['name']}: privileged")
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")) or 0 in (sc.get("runAsUser"), psc.get("runAsUser")):
            bad.append(f"{c['name']}: must run as non-root")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{c['name']}: seccompProfile must be RuntimeDefault")
        if c.get("ports") and any(p.get("hostPort") for p in c["ports"]):
            bad.append(f"{c['name']}: hostPort")
    return bad


def _quantity(q: str | int) -> float:
    """Enough of resource.Quantity for these manifests: plain, m, Ki/Mi/Gi/Ti."""
    s = str(q)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix in sorted(units, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * units[suffix]
    return float(s)


# --- rendering and schema -----------------------------------------------------------------------
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_rendered_object_validates_strictly(name):
    docs = RENDERED[name]
    assert len({_key(d) for d in docs}) == len(docs), "duplicate objects"
    for doc in docs:
        if not doc["apiVersion"].startswith(KUEUE_API):
            kubernetes_validate.validate(doc, SCHEMA, strict=True)


def test_every_static_file_and_patch_validates_on_its_own():
    """Files outside any rendering (and each patch as written) are schema-checked too."""
    files = [p for p in K8S.rglob("*.yaml") if p.name not in ("kustomization.yaml", "prefect.yaml")
             and "vllm" not in p.parts]
    assert len(files) > 15
    for p in files:
        for doc in yaml.safe_load_all(p.read_text()):
            if "/patches/" in str(p):  # partial by design: validate the patched result (above) and the shape
                assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
                continue
            if not doc["apiVersion"].startswith(KUEUE_API):
                kubernetes_validate.validate(doc, SCHEMA, strict=True)


def test_patches_change_what_they_claim():
    """The overlay patches really land (a no-op patch would still render and validate)."""
    dev, gpu = RENDERED["overlays/dev"], RENDERED["overlays/gpu-cluster"]
    mlflow_vols = {v["name"]: v for v in pod_specs(find(dev, "Deployment", "mlflow"))[0]["volumes"]}
    assert mlflow_vols["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "mlflow-data"}}
    assert find(dev, "PersistentVolumeClaim", "mlflow-data")
    assert find(dev, "ConfigMap", "temper-mlflow")["data"]["MLFLOW_ARTIFACTS_DESTINATION"] == "/mlflow/artifacts"
    assert find(dev, "Deployment", "temper-prefect-worker")["spec"]["replicas"] == 1
    assert "--limit" in pod_specs(find(dev, "Deployment", "temper-prefect-worker"))[0]["containers"][0]["command"]
    assert _quantity(find(dev, "ResourceQuota", "temper")["spec"]["hard"]["requests.cpu"]) < \
        _quantity(find(RENDERED["base"], "ResourceQuota", "temper")["spec"]["hard"]["requests.cpu"])
    assert find(gpu, "ResourceQuota", "temper")["spec"]["hard"]["requests.nvidia.com/gpu"] == "32"
    assert find(gpu, "Namespace", "temper")["metadata"]["labels"]["temper.dev/kueue-tenant"] == "temper"
    assert find(gpu, "Deployment", "mlflow")["spec"]["strategy"]["type"] == "RollingUpdate"
    assert find(gpu, "ConfigMap", "temper-prefect")["data"]["PREFECT_API_URL"].startswith("https://")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with built-in kustomize) not installed")
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_python_renderer_agrees_with_kustomize(name):
    out = subprocess.run(["kubectl", "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    real = {_key(d): d for d in yaml.safe_load_all(out.stdout) if d}
    ours = {_key(d): d for d in RENDERED[name]}
    assert set(real) == set(ours)
    for key in real:
        assert real[key] == ours[key], key


# --- policies -----------------------------------------------------------------------------------
ROLE_GRANTS = {
    # prefect-kubernetes worker: what prefect-worker.yaml's worker calls (see the comment in rbac.yaml)
    "temper-prefect-worker": {("batch", "jobs", v) for v in ("create", "get", "list", "watch", "delete")}
    | {("", "pods", v) for v in ("get", "list", "watch")} | {("", "pods/log", "get")}
    | {("", "events", "list"), ("", "events", "watch")},
    # flow-run pods: infra/k8s/api.py ClusterApi (launcher + sandbox backend)
    "temper-flow-runner": {("batch", "jobs", v) for v in ("create", "get", "delete")}
    | {("", "services", "create"), ("", "services", "delete")}
    | {("", "pods", v) for v in ("create", "get", "list", "delete")} | {("", "pods/log", "get")}
    | {("", "pods/exec", "create"), ("", "pods/exec", "get")}
    | {("", "serviceaccounts", "get"), ("", "resourcequotas", "list")}  # infra/k8s/preflight.py
    | {("", "events", "list")}  # the launcher: a Job's FailedCreate Events
    | {("kueue.x-k8s.io", "workloads", "list")},  # the launcher: why Kueue holds a Job (infra/k8s/api.py)
    # training/eval pods, in the sandbox namespace only: infra/sandbox/kubernetes.py KubernetesBackend
    "temper-sandbox-creator": {("", "pods", v) for v in ("create", "get", "delete")}
    | {("", "pods/exec", "create"), ("", "pods/exec", "get")},
    # flow-run pods, in the sandbox namespace: infra/k8s/launcher.py reap_sandboxes (what a finished job left)
    "temper-sandbox-reaper": {("", "pods", v) for v in ("get", "list", "delete")},
}


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_roles_grant_exactly_their_list_and_nothing_cluster_wide(name):
    docs = RENDERED[name]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    assert set(roles) == set(ROLE_GRANTS)
    for role_name, role in roles.items():
        got = set()
        for rule in role["rules"]:
            assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
            got |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
        assert "*" not in {x for t in got for x in t}
        assert got == ROLE_GRANTS[role_name], role_name
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    service_accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    for rb in (d for d in docs if d["kind"] == "RoleBinding"):
        assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": rb["metadata"]["name"]}
        for subject in rb["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["name"] in service_accounts
            # the sandbox namespace's bindings name accounts in temper: the workloads' (to make boxes) and the
            # flow runner's (to delete what a finished job left); nothing else crosses
            crossing = {("temper-sandbox-creator", "temper-workload"), ("temper-sandbox-reaper", "temper-flow-runner")}
            assert subject["namespace"] == rb["metadata"]["namespace"] or (
                rb["metadata"]["namespace"] == "temper-sandbox" and subject["namespace"] == "temper"
                and (rb["metadata"]["name"], subject["name"]) in crossing)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_worker_stays_inside_its_role(name):
    """The two settings that keep prefect-kubernetes from calling outside the namespaced Role."""
    docs = RENDERED[name]
    pod = pod_specs(find(docs, "Deployment", "temper-prefect-worker"))[0]
    assert pod["serviceAccountName"] == "temper-prefect-worker"
    (worker,) = pod["containers"]
    # docker/Dockerfile.worker: prefect and prefect-kubernetes are in the image, at the versions pyproject pins
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(d.split("==") for d in project["dependencies"] + project["optional-dependencies"]["kubernetes-worker"])
    assert worker["image"] == f"temper-prefect-worker:{pins['prefect']}-{pins['prefect-kubernetes']}"
    cmd = worker["command"]
    assert cmd[:3] == ["prefect", "worker", "start"]
    assert cmd[cmd.index("--type") + 1] == "kubernetes" and cmd[cmd.index("--pool") + 1] == "$(TEMPER_WORK_POOL)"
    env = {e["name"]: e for e in worker["env"]}
    assert env["PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES"]["valueFrom"] == \
        {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["PREFECT_KUBERNETES_CLUSTER_UID"]["valueFrom"]["configMapKeyRef"]["name"] == "temper-prefect"
    assert env["PREFECT_API_URL"]["valueFrom"]["configMapKeyRef"] == {"name": "temper-prefect", "key": "PREFECT_API_URL"}
    # nothing is installed when the pod starts (air-gapped clusters): no init container, no pip, no worker install
    assert cmd[cmd.index("--install-policy") + 1] == "never"
    assert not pod.get("initContainers") and "pip" not in json.dumps(pod)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_pods_are_restricted_with_resources_and_probes(name):
    docs = RENDERED[name]
    ns = find(docs, "Namespace", "temper")["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "restricted"
    limit_max = find(docs, "LimitRange", "temper")["spec"]["limits"][0]["max"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} >= {"temper-prefect-worker", "mlflow"}
    if name == "overlays/dev":  # the S3 store configs/k8s/sft-zero3-cpu.yaml points at: minio.temper.svc:9000
        svc = find(docs, "Service", "minio")
        assert svc["metadata"]["namespace"] == "temper" and svc["spec"]["ports"][0]["port"] == 9000
    for dep in deployments:
        pod = pod_specs(dep)[0]
        assert restricted_violations(pod) == [], dep["metadata"]["name"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        for c in containers(pod):
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (dep["metadata"]["name"], c["name"], kind)
            for res in ("cpu", "memory"):
                assert _quantity(c["resources"]["requests"][res]) <= _quantity(c["resources"]["limits"][res])
                assert _quantity(c["resources"]["limits"][res]) <= _quantity(limit_max[res]), (c["name"], res)
        for c in pod["containers"]:
            assert c.get("livenessProbe") and (c.get("readinessProbe") or c.get("startupProbe")), c["name"]


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_references_resolve(name):
    """ConfigMap keys, Secrets, claims, service accounts, Service selectors and named ports exist."""
    docs = RENDERED[name]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    secrets = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "Secret"}
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"} | {"default"}
    operator = OPERATOR_SECRETS.get(name, set())
    for doc in docs:
        for pod in pod_specs(doc):
            assert pod.get("serviceAccountName", "default") in accounts
            for vol in pod.get("volumes", []):
                if "persistentVolumeClaim" in vol:
                    assert vol["persistentVolumeClaim"]["claimName"] in claims
                if "configMap" in vol:
                    assert vol["configMap"]["name"] in configmaps
            for c in containers(pod):
                mounts = {v["name"] for v in pod.get("volumes", [])}
                assert {vm["name"] for vm in c.get("volumeMounts", [])} <= mounts, c["name"]
                ports = {p["name"] for p in c.get("ports", []) if "name" in p}
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
                    assert port is None or isinstance(port, int) or port in ports, (c["name"], probe)
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {})
                    if "configMapKeyRef" in ref and not ref["configMapKeyRef"].get("optional"):
                        cm = ref["configMapKeyRef"]
                        assert cm["key"] in configmaps.get(cm["name"], {}), (c["name"], cm)
                    if "secretKeyRef" in ref and not ref["secretKeyRef"].get("optional"):
                        sk = ref["secretKeyRef"]
                        assert sk["name"] in operator or sk["key"] in secrets.get(sk["name"], {}), (c["name"], sk)
    pods = [(d["spec"]["template"]["metadata"]["labels"], pod_specs(d)[0]) for d in docs if d["kind"] == "Deployment"]
    for svc in (d for d in docs if d["kind"] == "Service"):
        (labels, pod), = [(lb, p) for lb, p in pods if svc["spec"]["selector"].items() <= lb.items()]
        names = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
        assert all(p["targetPort"] in names for p in svc["spec"]["ports"]), svc["metadata"]["name"]


CREDENTIAL_URI = re.compile(r"://[^/@\s:]+:[^/@\s]+@")


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_no_credentials_in_the_repo(name):
    for doc in RENDERED[name]:
        if doc["kind"] == "Secret":
            values = {k: base64.b64decode(v).decode() for k, v in doc.get("data", {}).items()}
            values |= doc.get("stringData", {})
        elif doc["kind"] == "ConfigMap":
            values = doc.get("data", {})
        else:
            values = {}
        for key, value in values.items():
            assert not re.search(r"PASSWORD|SECRET|TOKEN|API_KEY", key), (doc["metadata"]["name"], key)
            assert not CREDENTIAL_URI.search(value), (doc["metadata"]["name"], key)
    text = "\n".join(json.dumps(d) for d in RENDERED[name])
    assert "AKIA" not in text  # an AWS access key id


def _options(docs: list[dict], tmp_path: Path) -> KubernetesOptions:
    path = tmp_path / "options.yaml"
    path.write_text(find(docs, "ConfigMap", "temper-k8s-options")["data"]["options.yaml"])
    return load_options(path)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_options_configmap_loads_and_names_what_exists(name, tmp_path):
    docs = RENDERED[name]
    opts = _options(docs, tmp_path)
    assert opts.namespace == find(docs, "Namespace", "temper")["metadata"]["name"]
    assert opts.service_account in {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    priorities = {d["metadata"]["name"] for d in docs if d["kind"] == "PriorityClass"}
    assert {opts.priority_class, opts.sandbox_priority_class} <= priorities
    if name == "overlays/gpu-cluster":
        assert opts.queue_name and opts.runtime_class and opts.tolerations and opts.node_selector


@pytest.mark.parametrize("config", sorted(CONFIG_TARGETS))
def test_job_configs_are_admissible_on_their_overlay(config, tmp_path):
    """Every container fits the LimitRange max and each Job fits the ResourceQuota: else the
    cluster would refuse (or never schedule) what `temper k8s render` produces."""
    docs = RENDERED[CONFIG_TARGETS[config]]
    limit_max = find(docs, "LimitRange", "temper")["spec"]["limits"][0]["max"]
    hard = find(docs, "ResourceQuota", "temper")["spec"]["hard"]
    cfg = load_render_config(ROOT / "configs/k8s" / config)
    for obj in render(cfg):
        for pod in pod_specs(obj):
            replicas = obj["spec"].get("parallelism", 1)
            assert restricted_violations(pod) == [], config
            assert pod.get("priorityClassName") in {d["metadata"]["name"] for d in docs if d["kind"] == "PriorityClass"}
            for c in containers(pod):
                for res in ("cpu", "memory"):
                    assert _quantity(c["resources"]["limits"][res]) <= _quantity(limit_max[res]), (config, res)
                    total = replicas * _quantity(c["resources"]["requests"][res])
                    assert total <= _quantity(hard[f"requests.{res}"]), (config, res)
                gpus = c["resources"]["requests"].get("nvidia.com/gpu")
                if gpus:
                    assert replicas * int(gpus) <= int(hard["requests.nvidia.com/gpu"]), config


def test_sandbox_network_policy_is_the_one_the_code_builds():
    static = yaml.safe_load((K8S / "base/networkpolicy-sandbox.yaml").read_text())
    assert static == m.to_dict(m.sandbox_network_policy("temper"))


# --- the Prefect work pool's base job template --------------------------------------------------
TEMPLATE = json.loads((K8S / "prefect/base-job-template.json").read_text())
# prefect-kubernetes 0.8.0 (_get_base_job_manifest): paths its validator requires in every job
# manifest. `parallelism`/`completions` under the *pod* spec are its quirk; the API server drops
# unknown fields (with a warning), so they are removed before strict validation below.
PREFECT_REQUIRED = {"metadata": {"annotations": {}, "labels": {}},
                    "spec": {"template": {"spec": {"parallelism": 1, "completions": 1, "restartPolicy": "Never",
                                                   "containers": [{"name": "prefect-job"}]}}}}


def _covers(have, need) -> bool:
    if isinstance(need, dict):
        return isinstance(have, dict) and all(k in have and _covers(have[k], v) for k, v in need.items())
    if isinstance(need, list):
        return isinstance(have, list) and len(have) >= len(need) and all(_covers(h, n) for h, n in zip(have, need))
    return need == {} or have == need


def _flow_run_manifest(**values) -> dict:
    """What the worker submits: Prefect's templating with the pool defaults plus run values."""
    from prefect.utilities.templating import apply_values

    defaults = {k: v["default"] for k, v in TEMPLATE["variables"]["properties"].items() if "default" in v}
    run = {"name": "validate-data-abc", "command": "prefect flow-run execute",
           "labels": {"prefect.io/flow-run-id": "0c5e5e36"}, **values}
    config = apply_values(TEMPLATE["job_configuration"], {**defaults, **run})
    job = config["job_manifest"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in container["env"].items()]  # as the worker does
    container["args"] = container["args"].split()
    return job


def test_base_job_template_placeholders_are_all_variables():
    from prefect.utilities.templating import find_placeholders

    used = {p.name for p in find_placeholders(TEMPLATE["job_configuration"])}
    assert used == set(TEMPLATE["variables"]["properties"])


def test_flow_run_job_is_valid_restricted_and_runs_as_flow_runner(tmp_path):
    job = _flow_run_manifest()
    assert _covers(job, PREFECT_REQUIRED)
    pod = job["spec"]["template"]["spec"]
    for quirk in ("parallelism", "completions"):
        pod.pop(quirk)
    job["metadata"]["name"] = job["metadata"].pop("generateName") + "x1"
    kubernetes_validate.validate(job, SCHEMA, strict=True)
    assert restricted_violations(pod) == []
    base = RENDERED["base"]
    assert pod["serviceAccountName"] == "temper-flow-runner" and job["metadata"]["namespace"] == "temper"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    (options_mount,) = [vm for vm in pod["containers"][0]["volumeMounts"] if vm["name"] == "options"]
    assert env["TEMPER_K8S_OPTIONS"].startswith(options_mount["mountPath"] + "/")
    (options_vol,) = [v for v in pod["volumes"] if v["name"] == "options"]
    cm = find(base, "ConfigMap", options_vol["configMap"]["name"])
    assert Path(env["TEMPER_K8S_OPTIONS"]).name in cm["data"]
    assert env["TEMPER_TRACKING_URI"] == "http://mlflow.temper.svc:5000"
    limit_max = find(base, "LimitRange", "temper")["spec"]["limits"][0]["max"]
    for res in ("cpu", "memory"):
        assert _quantity(pod["containers"][0]["resources"]["limits"][res]) <= _quantity(limit_max[res])


def test_prefect_deployment_file_targets_the_pool():
    spec = yaml.safe_load((K8S / "prefect/prefect.yaml").read_text())
    pool = find(RENDERED["base"], "ConfigMap", "temper-prefect")["data"]["TEMPER_WORK_POOL"]
    for dep in spec["deployments"]:
        assert dep["work_pool"]["name"] == pool
        path, _, flow = dep["entrypoint"].partition(":")
        assert f"def {flow}(" in (ROOT / path).read_text()
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    assert "COPY --chown=root:root flows ./flows" in dockerfile  # the pull step's /app/flows exists
