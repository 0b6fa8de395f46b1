"""JobSpec -> Kubernetes objects (official client models). Pure: no API calls, no cluster.

What a run submits and what ``temper k8s render`` prints are built by the same functions,
so the rendered YAML is exactly what the launcher sends.

Gang semantics for multi-node training: the ranks of one ZeRO-3 job are useless alone (the
survivors hang in a collective), so the Job fails as soon as any rank exits non-zero
(``backoffLimit: 0`` plus a ``podFailurePolicy`` FailJob rule). Disruptions (preemption,
node drain) are ignored by the policy so Kubernetes recreates that index instead of counting
a failure. Retries are new Jobs, made by the launcher (``<name>-r<k>``); the workload
resumes from its latest checkpoint in the store.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k

from infra.jobspec import JobSpec
from infra.k8s.errors import KubernetesError
from infra.k8s.options import KubernetesOptions
from temper.core.settings import with_job

PART_OF = {"app.kubernetes.io/part-of": "temper", "app.kubernetes.io/managed-by": "temper"}
JOB_LABEL = "temper.dev/job"
KIND_LABEL = "temper.dev/kind"
ROLE_LABEL = "temper.dev/role"
#: on a sandbox pod: the job whose pod made it; the launcher deletes what a job left when the job ends
OWNER_LABEL = "temper.dev/owner"
SANDBOX_ROLE = "sandbox"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
MAIN_CONTAINER = "main"
SANDBOX_WORK = "/work"  # the sandbox pod's writable dirs (emptyDirs); infra.sandbox.kubernetes uses them
SANDBOX_TMP = "/tmp"


def to_dict(obj: Any) -> dict:
    """camelCase manifest, as the API server (and kubectl) sees it."""
    return k.ApiClient().sanitize_for_serialization(obj)


def labels_for(name: str, kind: str, opts: KubernetesOptions | None = None, queue: bool = False) -> dict[str, str]:
    labels = {**PART_OF, JOB_LABEL: name, KIND_LABEL: kind}
    if queue and opts is not None and opts.queue_name:
        labels[QUEUE_LABEL] = opts.queue_name
    return labels


def restricted_container_security() -> k.V1SecurityContext:
    """Pod Security Standard 'restricted', plus a read-only root filesystem."""
    return k.V1SecurityContext(
        allow_privilege_escalation=False,
        read_only_root_filesystem=True,
        run_as_non_root=True,
        capabilities=k.V1Capabilities(drop=["ALL"]),
        seccomp_profile=k.V1SeccompProfile(type="RuntimeDefault"),
    )


def restricted_pod_security() -> k.V1PodSecurityContext:
    return k.V1PodSecurityContext(
        run_as_non_root=True, run_as_user=1000, run_as_group=1000, fs_group=1000,
        seccomp_profile=k.V1SeccompProfile(type="RuntimeDefault"),
    )


def _env(values: dict[str, str]) -> list[k.V1EnvVar]:
    return [k.V1EnvVar(name=key, value=str(val)) for key, val in sorted(values.items())]


def _scratch_volumes(shm_size: str | None, scratch_size: str | None) -> tuple[list, list]:
    """Writable dirs on a read-only root: /tmp (HOME, caches, torch extensions) and /dev/shm."""
    volumes = [k.V1Volume(name="tmp", empty_dir=k.V1EmptyDirVolumeSource(size_limit=scratch_size))]
    mounts = [k.V1VolumeMount(name="tmp", mount_path="/tmp")]
    if shm_size:
        volumes.append(k.V1Volume(name="dshm", empty_dir=k.V1EmptyDirVolumeSource(medium="Memory", size_limit=shm_size)))
        mounts.append(k.V1VolumeMount(name="dshm", mount_path="/dev/shm"))
    return volumes, mounts


def _resources(spec: JobSpec) -> k.V1ResourceRequirements:
    r = spec.resources
    amounts = {"cpu": r.cpu, "memory": r.memory}
    if r.gpus:
        amounts["nvidia.com/gpu"] = str(r.gpus)
    return k.V1ResourceRequirements(requests=dict(amounts), limits=dict(amounts))


def _tolerations(opts: KubernetesOptions) -> list[k.V1Toleration] | None:
    return [k.V1Toleration(**t.model_dump(exclude_none=True)) for t in opts.tolerations] or None


def service_name(spec: JobSpec) -> str:
    return spec.name  # headless Service named like the Job: pod FQDN <job>-<i>.<job>


def rendezvous_command(spec: JobSpec, opts: KubernetesOptions) -> list[str]:
    """The per-node launcher line. ``$(VAR)`` is expanded by the kubelet from the container env."""
    if not spec.distributed:
        return list(spec.command)
    program = list(spec.command)
    if program and program[0].rsplit("/", 1)[-1].startswith("python"):
        program = program[1:]  # accelerate launch runs the interpreter itself (also a full path: sys.executable)
    line = ["accelerate", "launch"]
    if spec.accelerate_config:
        line += ["--config_file", spec.accelerate_config]
    line += [
        "--num_machines", str(spec.nodes),
        "--num_processes", str(spec.world_size),
        "--machine_rank", "$(NODE_RANK)",
        "--main_process_ip", "$(MASTER_ADDR)",
        "--main_process_port", str(opts.rendezvous_port),
    ]
    if program and program[0] == "-m":
        return line + ["--module", *program[1:]]
    return line + program


def _workload_container(spec: JobSpec, opts: KubernetesOptions) -> k.V1Container:
    # the job's settings name the job: its sandbox pods carry it as their owner (KubernetesBackend.owner)
    env = with_job({"HOME": "/tmp", "TORCH_EXTENSIONS_DIR": "/tmp/torch_extensions", "HF_HOME": "/tmp/hf",
                    "TEMPER_BACKEND": "kubernetes", **opts.env, **spec.env}, sandbox_owner=spec.name)
    env_vars = _env(env)
    if spec.distributed:
        env_vars += [
            k.V1EnvVar(name="NODE_RANK", value_from=k.V1EnvVarSource(
                field_ref=k.V1ObjectFieldSelector(field_path=COMPLETION_INDEX))),
            k.V1EnvVar(name="MASTER_ADDR", value=f"{spec.name}-0.{service_name(spec)}"),
            k.V1EnvVar(name="MASTER_PORT", value=str(opts.rendezvous_port)),
            k.V1EnvVar(name="NNODES", value=str(spec.nodes)),
            k.V1EnvVar(name="NPROC_PER_NODE", value=str(spec.procs_per_node)),
        ]
    _, mounts = _scratch_volumes(spec.resources.shm_size, None)
    return k.V1Container(
        name=MAIN_CONTAINER,
        image=spec.image,
        image_pull_policy=opts.image_pull_policy,
        # args, not command: the image's ENTRYPOINT (an init, tini in docker/Dockerfile) stays PID 1 and passes
        # SIGTERM on to the ranks; as PID 1 themselves, `accelerate` or python would ignore it for the whole grace
        args=rendezvous_command(spec, opts),
        env=env_vars,
        env_from=[k.V1EnvFromSource(secret_ref=k.V1SecretEnvSource(name=opts.s3_secret))] if opts.s3_secret else None,
        ports=[k.V1ContainerPort(name="rendezvous", container_port=opts.rendezvous_port)] if spec.distributed else None,
        resources=_resources(spec),
        security_context=restricted_container_security(),
        volume_mounts=mounts,
    )


def _workload_pod(spec: JobSpec, opts: KubernetesOptions) -> k.V1PodSpec:
    volumes, _ = _scratch_volumes(spec.resources.shm_size, None)
    return k.V1PodSpec(
        containers=[_workload_container(spec, opts)],
        restart_policy="Never",
        service_account_name=opts.service_account,
        # The token lets a workload's verifiers create sandbox pods, and nothing else: its Role lives only in
        # the sandbox namespace, and an admission policy there admits only restricted, labelled sandbox pods.
        automount_service_account_token=True,
        subdomain=service_name(spec) if spec.distributed else None,
        node_selector=opts.node_selector or None,
        tolerations=_tolerations(opts),
        priority_class_name=opts.priority_class,
        security_context=restricted_pod_security(),
        image_pull_secrets=[k.V1LocalObjectReference(name=s) for s in opts.image_pull_secrets] or None,
        volumes=volumes,
        termination_grace_period_seconds=60,  # time to flush a checkpoint on SIGTERM
    )


def _check(spec: JobSpec) -> None:
    r = spec.resources
    if r.gpus and spec.procs_per_node != r.gpus:
        raise KubernetesError(
            f"job {spec.name!r}: procs_per_node={spec.procs_per_node} but resources.gpus={r.gpus}; "
            "run one process per GPU (set procs_per_node to the GPU count)")
    if spec.nodes > 1 and not spec.distributed:
        raise KubernetesError(f"job {spec.name!r}: nodes={spec.nodes} needs distributed: true (rendezvous)")


def training_job(spec: JobSpec, opts: KubernetesOptions, name: str | None = None) -> k.V1Job:
    """Indexed Job, parallelism = completions = nodes; index i is machine rank i."""
    _check(spec)
    name = name or spec.name
    if name != spec.name:
        spec = spec.model_copy(update={"name": name})
    labels = labels_for(name, spec.kind, opts, queue=True)
    pod_labels = labels_for(name, spec.kind)
    return k.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=k.V1ObjectMeta(name=name, namespace=opts.namespace, labels=labels),
        spec=k.V1JobSpec(
            completion_mode="Indexed",
            completions=spec.nodes,
            parallelism=spec.nodes,
            backoff_limit=0,
            pod_failure_policy=k.V1PodFailurePolicy(rules=[
                k.V1PodFailurePolicyRule(action="Ignore", on_pod_conditions=[
                    k.V1PodFailurePolicyOnPodConditionsPattern(type="DisruptionTarget", status="True")]),
                k.V1PodFailurePolicyRule(action="FailJob", on_exit_codes=k.V1PodFailurePolicyOnExitCodesRequirement(
                    container_name=MAIN_CONTAINER, operator="NotIn", values=[0])),
            ]),
            active_deadline_seconds=int(spec.timeout_s),
            ttl_seconds_after_finished=opts.ttl_seconds_after_finished,
            suspend=True if opts.queue_name else None,  # Kueue unsuspends on admission
            template=k.V1PodTemplateSpec(
                metadata=k.V1ObjectMeta(labels=pod_labels),
                spec=_workload_pod(spec, opts),
            ),
        ),
    )


def headless_service(spec: JobSpec, opts: KubernetesOptions, name: str | None = None) -> k.V1Service:
    """DNS for rank 0: ``<job>-0.<svc>`` resolves before the pods are Ready (publishNotReadyAddresses)."""
    name = name or spec.name
    return k.V1Service(
        api_version="v1", kind="Service",
        metadata=k.V1ObjectMeta(name=name, namespace=opts.namespace, labels=labels_for(name, spec.kind)),
        spec=k.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={JOB_LABEL: name},
            ports=[k.V1ServicePort(name="rendezvous", port=opts.rendezvous_port, target_port=opts.rendezvous_port)],
        ),
    )


def eval_jobs(spec: JobSpec, opts: KubernetesOptions, shards: int) -> list[k.V1Job]:
    """One Job per shard: shards are independent, so each retries alone (backoffLimit = retries)."""
    if shards < 1:
        raise KubernetesError(f"job {spec.name!r}: shards must be >= 1, got {shards}")
    _check(spec)
    jobs = []
    for i in range(shards):
        name = f"{spec.name}-s{i}" if shards > 1 else spec.name
        shard_spec = spec.model_copy(update={"name": name, "distributed": False,
                                             "env": with_job(spec.env, shard_index=i, num_shards=shards)})
        jobs.append(k.V1Job(
            api_version="batch/v1", kind="Job",
            metadata=k.V1ObjectMeta(name=name, namespace=opts.namespace, labels=labels_for(name, "eval", opts, queue=True)),
            spec=k.V1JobSpec(
                completions=1, parallelism=1,
                backoff_limit=spec.retries,
                active_deadline_seconds=int(spec.timeout_s),
                ttl_seconds_after_finished=opts.ttl_seconds_after_finished,
                suspend=True if opts.queue_name else None,
                template=k.V1PodTemplateSpec(
                    metadata=k.V1ObjectMeta(labels=labels_for(name, "eval")),
                    spec=_workload_pod(shard_spec, opts),
                ),
            ),
        ))
    return jobs


def sandbox_pod_spec(name: str, command: list[str], opts: KubernetesOptions, deadline_s: int,
                     env: dict[str, str] | None = None, image: str | None = None) -> k.V1PodSpec:
    """Untrusted code: restricted PSS, no token, no network (NetworkPolicy), gVisor/Kata if configured."""
    volumes = [
        k.V1Volume(name="work", empty_dir=k.V1EmptyDirVolumeSource(size_limit=opts.sandbox_scratch)),
        k.V1Volume(name="tmp", empty_dir=k.V1EmptyDirVolumeSource(size_limit=opts.sandbox_scratch)),
    ]
    limits = {"cpu": opts.sandbox_cpu, "memory": opts.sandbox_memory, "ephemeral-storage": opts.sandbox_scratch}
    return k.V1PodSpec(
        containers=[k.V1Container(
            name=MAIN_CONTAINER,
            image=image or opts.sandbox_image,
            image_pull_policy=opts.image_pull_policy,
            command=list(command),
            working_dir=SANDBOX_WORK,
            env=_env({"HOME": SANDBOX_WORK, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}),
            resources=k.V1ResourceRequirements(requests=dict(limits), limits=dict(limits)),
            security_context=restricted_container_security(),
            volume_mounts=[k.V1VolumeMount(name="work", mount_path=SANDBOX_WORK),
                           k.V1VolumeMount(name="tmp", mount_path=SANDBOX_TMP)],
        )],
        restart_policy="Never",
        active_deadline_seconds=int(deadline_s),
        automount_service_account_token=False,
        enable_service_links=False,
        host_users=None,
        runtime_class_name=opts.runtime_class,
        priority_class_name=opts.sandbox_priority_class,
        security_context=restricted_pod_security(),
        image_pull_secrets=[k.V1LocalObjectReference(name=s) for s in opts.image_pull_secrets] or None,
        termination_grace_period_seconds=0,
        volumes=volumes,
    )


def sandbox_labels(name: str, kind: str = "sandbox") -> dict[str, str]:
    return {**labels_for(name, kind), ROLE_LABEL: SANDBOX_ROLE}


def sandbox_job(spec: JobSpec, opts: KubernetesOptions) -> k.V1Job:
    """A JobSpec of kind 'sandbox' run to completion (batch verification) as a one-pod Job."""
    return k.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=k.V1ObjectMeta(name=spec.name, namespace=opts.sandbox_ns, labels=sandbox_labels(spec.name)),
        spec=k.V1JobSpec(
            completions=1, parallelism=1, backoff_limit=0,
            active_deadline_seconds=int(spec.timeout_s),
            ttl_seconds_after_finished=opts.ttl_seconds_after_finished,
            template=k.V1PodTemplateSpec(
                metadata=k.V1ObjectMeta(labels=sandbox_labels(spec.name)),
                spec=sandbox_pod_spec(spec.name, spec.command, opts, int(spec.timeout_s), spec.env, spec.image),
            ),
        ),
    )


def sandbox_pod(name: str, opts: KubernetesOptions, deadline_s: int, image: str | None = None,
                owner: str | None = None) -> k.V1Pod:
    """A long-lived sandbox (idle PID 1; programs arrive by exec), killed at its deadline; ``owner``: the job whose pod
    makes it (``OWNER_LABEL``), so that whatever the job leaves behind is deleted when the job ends."""
    labels = {**sandbox_labels(name), **({OWNER_LABEL: owner} if owner else {})}
    return k.V1Pod(
        api_version="v1", kind="Pod",
        metadata=k.V1ObjectMeta(name=name, namespace=opts.sandbox_ns, labels=labels),
        spec=sandbox_pod_spec(name, ["sleep", str(int(deadline_s))], opts, deadline_s, image=image),
    )


def sandbox_network_policy(namespace: str) -> k.V1NetworkPolicy:
    """Deny all egress (and ingress) for sandbox pods; exec goes through the kubelet, not the pod network."""
    return k.V1NetworkPolicy(
        api_version="networking.k8s.io/v1", kind="NetworkPolicy",
        metadata=k.V1ObjectMeta(name="temper-sandbox-deny-all", namespace=namespace, labels=dict(PART_OF)),
        spec=k.V1NetworkPolicySpec(
            pod_selector=k.V1LabelSelector(match_labels={ROLE_LABEL: SANDBOX_ROLE}),
            policy_types=["Ingress", "Egress"],
            ingress=[], egress=[],
        ),
    )


def objects_for(spec: JobSpec, opts: KubernetesOptions, shards: int = 1, attempt: int = 0) -> list[Any]:
    """Every object one attempt of ``spec`` creates, in creation order (Service before the Job)."""
    name = attempt_name(spec.name, attempt)
    if spec.kind == "train":
        objs: list[Any] = []
        if spec.distributed:
            objs.append(headless_service(spec, opts, name))
        return objs + [training_job(spec, opts, name)]
    if spec.kind == "eval":
        return eval_jobs(spec.model_copy(update={"name": name}), opts, shards)
    return [sandbox_job(spec.model_copy(update={"name": name}), opts)]


def attempt_name(name: str, attempt: int) -> str:
    return name if attempt == 0 else f"{name}-r{attempt}"
