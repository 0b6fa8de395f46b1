"""Kubernetes-only knobs, kept out of ``JobSpec`` so the local launcher never sees them.

One cluster has one options file: the ``temper-k8s-options`` ConfigMap (k8s/base) mounts it
into flow-run pods and ``TEMPER_K8S_OPTIONS`` points at it. ``load_options`` is the only
reader, and ``load_yaml_model`` is the one YAML -> pydantic path every temper config file on
the Kubernetes side goes through, so a typo fails the same way everywhere: naming the file and
the field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.jobspec import Resources
from infra.k8s.errors import KubernetesError

OPTIONS_ENV = "TEMPER_K8S_OPTIONS"
OPTIONS_JSON_ENV = "TEMPER_K8S_OPTIONS_JSON"  # the flow hands its options to the pods it starts, inline
M = TypeVar("M", bound=BaseModel)


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="Taint key to tolerate, e.g. 'nvidia.com/gpu'.")
    operator: str = Field(default="Exists", description="'Exists' or 'Equal'.")
    value: str | None = Field(default=None, description="Taint value when operator is 'Equal'.")
    effect: str | None = Field(default="NoSchedule", description="Taint effect; None tolerates every effect.")


class KubernetesOptions(BaseModel):
    """Where and how a JobSpec lands on a cluster; one per cluster, not per job."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(default="temper", description="Namespace of training/eval Jobs and their Services.")
    sandbox_namespace: str | None = Field(default=None,
                                          description="Namespace of sandbox pods; empty = `namespace`. k8s/base gives "
                                          "them their own (temper-sandbox), so what workloads may create there is "
                                          "limited by a Role plus a ValidatingAdmissionPolicy (k8s/base/sandbox.yaml).")
    service_account: str = Field(default="temper-workload",
                                 description="Service account of training/eval pods: its token may only create "
                                 "restricted sandbox pods in sandbox_namespace (sandbox pods get no token).")
    image: str = Field(default="temper-workload:latest",
                       description="Image of the training/eval pods the flow starts (docker/Dockerfile).")
    app_dir: str = Field(default="/app", description="The temper checkout inside that image (its WORKDIR): where "
                         "the ZeRO-3 accelerate config (docker/accelerate-zero3-multinode-cpu.yaml) is.")
    accelerate_config: str = Field(default="docker/accelerate-zero3-multinode-cpu.yaml",
                                   description="accelerate config of multi-pod ZeRO-3 training, relative to app_dir.")
    env: dict[str, str] = Field(default_factory=dict,
                                description="Extra environment of training/eval pods, e.g. TORCH_EXTENSIONS_DIR on a "
                                "cache volume for an image without DeepSpeed's CPU comm op compiled in it (docker/"
                                "Dockerfile compiles it; else every pod JIT-compiles it, ~1 min).")
    train_resources: Resources = Field(default_factory=lambda: Resources(cpu="1", memory="4Gi", shm_size="1Gi"),
                                       description="Requests/limits of each training pod (one rank per pod).")
    eval_resources: Resources = Field(default_factory=lambda: Resources(cpu="1", memory="4Gi", shm_size="256Mi"),
                                      description="Requests/limits of each eval shard's pod.")
    node_selector: dict[str, str] = Field(default_factory=dict,
                                          description="Node labels training/eval pods must match, e.g. GPU type.")
    tolerations: list[Toleration] = Field(default_factory=list,
                                          description="Taints training/eval pods tolerate (GPU nodes are usually tainted).")
    priority_class: str | None = Field(default="temper-training",
                                       description="PriorityClass of training/eval pods (k8s/base/priorityclasses.yaml).")
    sandbox_priority_class: str | None = Field(default="temper-sandbox", description="PriorityClass of sandbox pods.")
    queue_name: str | None = Field(default=None,
                                   description="Kueue LocalQueue; sets the kueue.x-k8s.io/queue-name label (Kueue admits the job).")
    s3_secret: str | None = Field(default="temper-s3",
                                  description="Secret with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (+ optional "
                                  "TEMPER_S3_ENDPOINT_URL), injected with envFrom into training/eval pods.")
    runtime_class: str | None = Field(default=None,
                                      description="RuntimeClass of sandbox pods, e.g. 'gvisor' or 'kata'; None = node default.")
    ttl_seconds_after_finished: int = Field(default=3600, ge=0,
                                            description="Seconds a finished Job (and its pods/logs) stays before GC.")
    rendezvous_port: int = Field(default=29500, ge=1, le=65535, description="torch.distributed rendezvous port.")
    image_pull_policy: str = Field(default="IfNotPresent", description="imagePullPolicy of every container.")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets for a private registry.")
    poll_interval_s: float = Field(default=5.0, gt=0, description="How often the launcher reads Job status.")
    unschedulable_after_s: float = Field(default=900.0, gt=0,
                                         description="Fail a job whose pods stay Unschedulable this long "
                                         "(not applied while Kueue holds the job suspended).")
    sandbox_cpu: str = Field(default="1", description="CPU limit of a sandbox pod.")
    sandbox_memory: str = Field(default="1Gi", description="Memory limit of a sandbox pod.")
    sandbox_scratch: str = Field(default="256Mi", description="Size of the sandbox's writable /work and /tmp.")
    sandbox_image: str = Field(default="temper-workload:latest", description="Image of sandbox pods (needs python3).")
    sandbox_lifetime_s: int = Field(default=3600, ge=60,
                                    description="Longest life of one sandbox pod (activeDeadlineSeconds): a box "
                                    "the caller forgets to close is killed by the cluster after this.")
    sandbox_start_timeout_s: float = Field(default=180.0, gt=0,
                                           description="How long creating a sandbox box waits for its pod to run "
                                           "(scheduling + image pull) before giving up and deleting it.")

    @property
    def sandbox_ns(self) -> str:
        """Where sandbox pods go: ``sandbox_namespace``, else the jobs' own namespace."""
        return self.sandbox_namespace or self.namespace


def load_yaml_model(path: str | os.PathLike, model: type[M], what: str) -> M:
    """Read a YAML file into ``model``; KubernetesError naming the file and every bad field."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as e:
        raise KubernetesError(f"{what} {path}: file not found") from e
    except yaml.YAMLError as e:
        raise KubernetesError(f"{what} {path}: not valid YAML: {e}") from e
    if raw is not None and not isinstance(raw, dict):
        raise KubernetesError(f"{what} {path}: expected a mapping of fields, got {type(raw).__name__}")
    try:
        return model.model_validate(raw or {})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']}"
                             for err in e.errors())
        raise KubernetesError(f"{what} {path}: {problems} ({e.error_count()} error(s))") from e


def load_options(path: str | os.PathLike) -> KubernetesOptions:
    """The cluster's options file (the ``options.yaml`` key of the ``temper-k8s-options`` ConfigMap)."""
    return load_yaml_model(path, KubernetesOptions, "kubernetes options")


def options_from_env(environ: Mapping[str, str] | None = None) -> KubernetesOptions:
    """Options from the file ``TEMPER_K8S_OPTIONS`` names (flow-run pods), else inline JSON in
    ``TEMPER_K8S_OPTIONS_JSON`` (the training/eval pods a flow starts), else the defaults."""
    env = os.environ if environ is None else environ
    if env.get(OPTIONS_ENV):
        return load_options(env[OPTIONS_ENV])
    if env.get(OPTIONS_JSON_ENV):
        try:
            return KubernetesOptions.model_validate_json(env[OPTIONS_JSON_ENV])
        except ValidationError as e:
            raise KubernetesError(f"{OPTIONS_JSON_ENV}: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    return KubernetesOptions()
