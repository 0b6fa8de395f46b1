"""Where a post_training run's jobs run: one execution backend, chosen once per flow run.

The flow's tasks build the same workloads whatever the backend: the stage's one ``TrainConfig``
(``tasks.training.stage_config``) and the one eval command (``workloads.evaluate`` over a set of
domains, sharded by the job settings' ``shard_index``/``num_shards``). What differs is only here:

- how a job starts: a local process group (``infra.launcher_local``), or an Indexed Job +
  headless Service / sharded eval Jobs (``infra.k8s.launcher``, after ``infra.k8s.preflight``);
- where the files a job reads and writes live: this machine, or the store (``s3://`` on a
  cluster: the training config, the exported model, eval results, checkpoints);
- which sandbox the jobs' verifiers use (the settings' ``sandbox_backend``: bubblewrap here, sandbox
  pods on the cluster, ``infra.sandbox.pool.default_backend``).

Every job gets its settings as typed sections the job's own ``Settings`` parses back
(``temper.core.settings.section_env``/``with_job``): the sandbox backend, the flow's rollout section
(where eval jobs generate with ``--generator rollout``) and the job section (parent run, shard).

``execution_for(backend)`` is the one place that maps the parameter to a backend; nothing else
in the flow or its tasks branches on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import yaml

from infra.jobspec import JobSpec, job_name
from infra.k8s import manifests as m
from infra.k8s import preflight
from infra.k8s.api import ClusterApi, load_config
from infra.k8s.errors import JobFailed
from infra.k8s.launcher import KubernetesLauncher
from infra.k8s.options import options_from_env
from infra.launcher_local import job_error, run_job
from infra.storage import exists, join, put_dir, write_bytes_atomic
from temper.core.errors import TemperError
from temper.core.settings import get_settings, section_env, with_job
from temper.training.config import TrainConfig
from temper.training.deepspeed import accelerator_env
from temper.training.job import training_job
from temper.training.progress import quiet_env

LineFn = Callable[[str], None]


class JobError(TemperError):
    """A training or eval job did not succeed; the message names the job and ends with its last lines."""


class Execution(Protocol):
    name: str

    def share(self, path: str) -> str: ...
    def training_job(self, cfg: TrainConfig, parent_run_id: str) -> tuple[JobSpec, str]: ...
    def eval_out(self, job: str) -> str: ...
    def run(self, spec: JobSpec, on_line: LineFn, shards: int = 1) -> None: ...


class LocalExecution:
    """Local processes in their own process group; files on this machine; bubblewrap sandboxes."""

    name = "local"

    def env(self) -> dict[str, str]:
        """The settings every job of the run gets: bubblewrap sandboxes, DeepSpeed's accelerator (``accelerator_env``)
        and the flow's rollout section (the api key stays out of the job's spec: a local job has it from this
        process's environment)."""
        return {"TEMPER_SANDBOX_BACKEND": "bwrap", **accelerator_env(),
                **section_env("rollout", get_settings().rollout, {"api_key"})}

    def share(self, path: str) -> str:
        return path

    def training_job(self, cfg: TrainConfig, parent_run_id: str) -> tuple[JobSpec, str]:
        config_path = Path(cfg.output_dir).parent / f"{cfg.mode}.yaml"
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False))
        spec = training_job(str(config_path), cfg.mode)
        spec.env.update(with_job(self.env(), parent_run_id=parent_run_id))
        return spec, str(Path(cfg.output_dir) / "model")

    def eval_out(self, job: str) -> str:
        return tempfile.mkdtemp(prefix=f"temper-{job}-")

    def run(self, spec: JobSpec, on_line: LineFn, shards: int = 1) -> None:
        """``shards`` copies of the job at once, each with its shard in its job settings; any non-zero exit raises."""
        specs = [spec.model_copy(update={
            "name": f"{spec.name}-s{i}" if shards > 1 else spec.name,
            "env": with_job({**spec.env, **self.env()}, shard_index=i, num_shards=shards)})
            for i in range(shards)] if spec.kind == "eval" else [spec]
        tails = [deque(maxlen=40) for _ in specs]
        errors: list[list[str]] = [[] for _ in specs]

        def one(i: int) -> int:
            def line(text: str) -> None:
                tails[i].append(text)
                if job_error([text]):
                    errors[i].append(text)
                on_line(text)
            # named by the job: a later attempt (a task retry, `temper resume`) stops what this one left running
            return run_job(specs[i], on_line=line, claim=get_settings().home.resolve() / "jobs" / f"{specs[i].name}.pid")

        with ThreadPoolExecutor(len(specs)) as pool:
            statuses = list(pool.map(one, range(len(specs))))
        bad = next((i for i, st in enumerate(statuses) if st), None)
        if bad is not None:
            if reason := job_error(errors[bad]):  # the workload's own line; torchrun's traceback follows it
                raise JobError(f"job {specs[bad].name} failed: {reason}")
            raise JobError(f"job {specs[bad].name} failed with exit status {statuses[bad]}; last lines:\n"
                           + "\n".join(tails[bad]))


class KubernetesExecution:
    """Jobs on a cluster through ``infra.k8s.launcher``; files in the store; sandbox pods for verifiers.

    The pods see neither this machine's files nor its sqlite tracking store, so the store must be
    a URI the pods reach (``s3://`` on a cluster) and tracking an MLflow server.
    """

    name = "kubernetes"
    POD_HOME = "/tmp/temper"  # the pods' writable emptyDir; the image's root is read-only

    def __init__(self, api=None, opts=None, host: str | None = None) -> None:
        if api is None:
            load_config()
            api = ClusterApi()
        self.api, self.opts = api, opts or options_from_env()
        client = getattr(api, "api_client", None)
        self.host = host or (client.configuration.host if client is not None else "the API server")
        self.launcher = KubernetesLauncher(api, self.opts)
        self._checked: set[str] = set()
        self._lock = threading.Lock()

    # --- where files live ---------------------------------------------------------------
    def _store(self, *parts: str) -> str:
        root = get_settings().resolved_storage_root
        if "://" not in root:
            raise TemperError(f"storage root {root}: a local path, which pods on a cluster cannot read; set "
                              "TEMPER_STORAGE_ROOT to an s3:// URI (the dev overlay's MinIO, or any S3 store)")
        return join(root, *parts)

    def share(self, path: str) -> str:
        """A local model folder copied once into the store (keyed by its files' names, sizes and mtimes)."""
        if "://" in path:
            return path
        files = sorted((p.relative_to(path).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                       for p in Path(path).rglob("*") if p.is_file())
        key = hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]
        uri = self._store("shared", f"{Path(path).name}-{key}")
        if not exists(uri + "/config.json"):
            put_dir(path, uri)
        return uri

    def env(self) -> dict[str, str]:
        """What every pod of the run needs to reach the same store, tracking server, sandboxes and rollout server.

        Of the rollout section only what addresses a server goes: the embedded engine's folders are on this
        machine (a pod serves the model it evaluates), and the api key is a credential (give pods it through
        the options' ``env`` or the S3 secret's way, not in the Job's spec)."""
        s = get_settings()
        tracking = s.resolved_tracking_uri
        if not tracking.startswith(("http://", "https://")):
            raise TemperError(f"tracking URI {tracking}: pods on a cluster cannot write to it; set TEMPER_TRACKING_URI "
                              "to an MLflow server (k8s/base/mlflow.yaml)")
        env = {"TEMPER_HOME": self.POD_HOME, "TEMPER_STORAGE_ROOT": self._store(), "TEMPER_TRACKING_URI": tracking,
               "TEMPER_SANDBOX_BACKEND": "kubernetes", "TEMPER_K8S_OPTIONS_JSON": self.opts.model_dump_json(),
               **section_env("rollout", s.rollout, {"api_key", "model_dir", "profile", "draft_dir"})}
        if s.s3_endpoint_url:
            env["TEMPER_S3_ENDPOINT_URL"] = s.s3_endpoint_url
        if os.environ.get("KUBECONFIG"):  # a path, not a credential: pods of a real cluster use in-cluster config first
            env["KUBECONFIG"] = os.environ["KUBECONFIG"]
        return env

    def training_job(self, cfg: TrainConfig, parent_run_id: str) -> tuple[JobSpec, str]:
        """One rank per pod; the config and the exported model travel through the store."""
        env = self.env()  # first: what the pods cannot reach fails before anything is written
        pod_cfg = cfg.model_copy(update={"output_dir": f"{self.POD_HOME}/runs/{cfg.run_name}/{cfg.mode}"})
        config_uri, model_uri = self._store("runs", cfg.run_name, "train_config.yaml"), self._store("runs", cfg.run_name, "model")
        write_bytes_atomic(config_uri, yaml.safe_dump(pod_cfg.to_yaml_dict(), sort_keys=False).encode())
        spec = JobSpec(
            name=job_name(cfg.mode, cfg.run_name), kind="train", image=self.opts.image,
            command=["python", "-m", "workloads.train", cfg.mode, "--config", config_uri, "--export-to", model_uri],
            env={**quiet_env(), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                 **with_job(env, parent_run_id=parent_run_id)},
            nodes=cfg.world_size if cfg.deepspeed else 1, procs_per_node=1, distributed=cfg.deepspeed,
            accelerate_config=f"{self.opts.app_dir.rstrip('/')}/{self.opts.accelerate_config}" if cfg.deepspeed else None,
            resources=self.opts.train_resources, timeout_s=cfg.stage.timeout_s, retries=1)
        return spec, model_uri

    def eval_out(self, job: str) -> str:
        return self._store("eval", job)

    # --- running ------------------------------------------------------------------------
    def preflight(self, spec: JobSpec, shards: int) -> None:
        """Once per namespace and process: the cluster answers and could ever admit the job (one line if not)."""
        with self._lock:
            if self.opts.namespace in self._checked:
                return
            preflight.check(self.api, str(self.host), self.opts.namespace, self.opts.service_account,
                            m.objects_for(spec, self.opts, shards=shards))
            self._checked.add(self.opts.namespace)

    def for_cluster(self, spec: JobSpec) -> JobSpec:
        """The job as pods run it: the image, its interpreter (not this machine's path), the run's env."""
        command = ["python", *spec.command[1:]] if spec.command and spec.command[0] == sys.executable else spec.command
        return spec.model_copy(update={
            "image": self.opts.image, "command": list(command), "env": {**spec.env, **self.env()},
            "resources": self.opts.eval_resources if spec.kind == "eval" else spec.resources})

    def run(self, spec: JobSpec, on_line: LineFn, shards: int = 1) -> None:
        """Run to success; a failed pod's last log lines follow the launcher's one-line reason, as locally."""
        spec = self.for_cluster(spec)
        self.preflight(spec, shards)
        tails: dict[str, deque] = {}

        def line(text: str) -> None:
            if text.startswith("[") and "] " in text:
                pod, _, rest = text[1:].partition("] ")
                tails.setdefault(pod, deque(maxlen=40)).append(rest)
            on_line(text)

        try:
            self.launcher.run(spec, on_log=line, shards=shards)
        except JobFailed as e:
            tail = tails.get(e.pod or "")
            if not tail:
                raise
            raise JobError(f"{e}; last lines of pod {e.pod}:\n" + "\n".join(tail)) from None


@lru_cache(maxsize=2)
def execution_for(backend: str) -> Execution:
    """The execution backend of a flow run's ``backend`` parameter (one instance per process)."""
    if backend == "kubernetes":
        return KubernetesExecution()
    if backend == "local":
        return LocalExecution()
    raise TemperError(f"backend {backend!r}: unknown; use 'local' or 'kubernetes'")
