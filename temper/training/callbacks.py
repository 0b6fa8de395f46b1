"""The Trainer callback that ties a TRL run into temper: metrics, checkpoints, MLflow.

Every rank runs it (collectives must be entered by all ranks); only rank 0 writes
metrics.jsonl and talks to MLflow, and each machine's local rank 0 mirrors checkpoints to
the store (each machine holds its own ranks' ZeRO partitions). With multi-step domains, a few of the
episodes of each logging step go to MLflow as readable pages (``trajectories/step-<s>/``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from infra.tracking.connection import configure, outage_named
from infra.tracking.runs import code_version, config_hash, log_datasets, open_keyed_run, use_experiment
from temper.agent import trajectories
from temper.core.settings import Settings
from temper.core.tag_names import CONTEXT_TRAINING, TAG_BASE_MODEL, TAG_CONFIG_HASH, TAG_GIT, TAG_KIND, TAG_STAGE
from temper.training import checkpoint as ckpt
from temper.training.charts import curriculum_weights_csv, domain_heatmap_png, domain_table_csv, read_metrics
from temper.training.config import TrainConfig, TrainingError
from temper.training.curriculum import CurriculumStream
from temper.training.device import Placement, peak_flops
from temper.training.export import log_and_register, reward_curve_png
from temper.training.progress import progress_line
from temper.training.rewards import DomainRewards, merge_summaries, step_totals
from temper.training.throughput import RolloutTimer, model_flops_utilization

SAMPLED_TRAJECTORIES = 2  # episodes per multi-step domain and logging step shown as MLflow artifacts


def _dist():
    # lazy: torch (1.5 s) would load in fast unit tests (test_domain_roles.py)
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _rank() -> int:
    # RANK/LOCAL_RANK are the launcher's contract (torchrun, accelerate launch), not temper settings: the variables
    # torch.distributed reads itself, there with or without a process group (one-process runs have none)
    return int(os.environ.get("RANK", "0"))


def shard_report(model) -> dict[str, int]:
    """Parameters this rank holds vs the model's full size (ZeRO-3 stores ``ds_tensor`` partitions)."""
    full = local = 0
    for p in model.parameters():
        if hasattr(p, "ds_tensor"):
            full += p.ds_numel
            local += p.ds_tensor.numel()
        else:
            full += p.numel()
            local += p.numel()
    return {"rank": _rank(), "full_numel": full, "local_numel": local}


def tracking_enabled(cfg: TrainConfig, settings: Settings) -> bool:
    """Tracking goes to settings' resolved URI: a server, or the embedded sqlite under TEMPER_HOME."""
    return cfg.tracking


class TemperCallback(TrainerCallback):
    def __init__(self, cfg: TrainConfig, settings: Settings, *, placement: Placement, digests: dict[str, str],
                 uris: dict[str, str], frames: dict[str, Any], sampler_state: Callable[[int], dict],
                 rewards: DomainRewards | None, base_model: str, stream: CurriculumStream | None = None,
                 rollouts: RolloutTimer | None = None) -> None:
        self.cfg, self.settings, self.placement = cfg, settings, placement
        self.rollouts = rollouts  # GRPO: the time each step spent sampling (the rest is the training phase)
        self.peak_flops = peak_flops(placement)
        self.params = 0
        self._tokens_at_step: float | None = None  # num_tokens after the last logged step (MFU's T)
        self.digests, self.uris, self.frames = digests, uris, frames
        self.sampler_state, self.rewards, self.base_model = sampler_state, rewards, base_model
        self.stream = stream
        self._reward_parts: list[dict] | None = None
        self.out = Path(cfg.output_dir)
        self.main = _rank() == 0
        self.local_main = int(os.environ.get("LOCAL_RANK", "0")) == 0
        self.mlflow_run = None
        self.history: list[dict[str, float]] = []
        self._t_step = self._t_log = time.perf_counter()
        self._tokens_at_log: float | None = None
        self._t_begin, self._step_begin = time.perf_counter(), 0
        self._trajectories_read: dict[Path, int] = {}  # trajectory file of a rank on this machine -> bytes sampled

    # -- lifecycle ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kw):
        if model is not None:
            report = shard_report(model)
            self.params = report["full_numel"]
            if self.cfg.log_shards:
                (self.out / f"shards-rank{_rank()}.json").write_text(json.dumps(report))
        if self.main and tracking_enabled(self.cfg, self.settings):
            self._start_mlflow()
        self._t_log = self._t_begin = time.perf_counter()
        self._tokens_at_step = state.num_input_tokens_seen  # restored by a resume: the first step has its T too
        self._step_begin = state.global_step  # > 0 when resumed: the ETA counts this process's pace only
        for path in (self.out / "trajectories").glob("rank*.jsonl"):  # a resumed run: only new episodes are sampled
            self._trajectories_read[path] = path.stat().st_size

    def _start_mlflow(self) -> None:
        """The stage's MLflow run, found again by its key when the run resumes, on this machine or another
        (a rescheduled pod, a flow continued by `temper resume`): one run per stage. The key is the mode,
        run name and store folder: the same identity the checkpoints are found by (``ckpt.store_uri``)."""
        # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
        import mlflow

        configure(self.settings, wait=True)
        with outage_named(f"the start of {self.cfg.mode} run {self.cfg.run_name}"):
            use_experiment(self.cfg.mlflow_experiment, self.settings)
            parent = self.settings.job.parent_run_id  # the lifecycle run, when a flow started this job
            name, key = f"{self.cfg.mode}-{self.cfg.run_name}", ckpt.record_key(self.cfg, self.settings)
            run_id, existed = open_keyed_run(self.cfg.mlflow_experiment, key, name, parent_run_id=parent, tags={
                    TAG_KIND: "stage", TAG_STAGE: self.cfg.mode, TAG_GIT: code_version(),
                    TAG_CONFIG_HASH: config_hash(self.cfg), TAG_BASE_MODEL: self.base_model})
            self.mlflow_run = mlflow.start_run(run_id=run_id)
            if existed:  # a resumed run continues the same MLflow run
                return
            mlflow.log_dict(self.cfg.to_yaml_dict(), "train_config.json")
            # what the config's 'auto' became on this machine (the config hash stays the file's)
            mlflow.log_params({"device": self.placement.device.split(":")[0], "precision": self.placement.precision,
                               "world_size": self.cfg.world_size})
            log_datasets(((name, frame, self.uris[name], self.digests[name]) for name, frame in self.frames.items()),
                         context=CONTEXT_TRAINING)

    def on_step_begin(self, args, state, control, **kw):
        self._t_step = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self._last_step_time = time.perf_counter() - self._t_step
        if self.rewards is None:
            return
        # Every rank scored its own samples: combine them on every rank, once per step, so that the
        # curriculum (which must decide identically everywhere) and the metrics see the same counts.
        batch = state.global_step - 1
        part = {"rewards": self.rewards.summary(), "groups": dict(self.rewards.groups),
                "stream": self.stream.digest(batch) if self.stream is not None else None}
        self.rewards.reset_stats()
        dist = _dist()
        parts = [part]
        if dist is not None:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, part)
        self._reward_parts = [p["rewards"] for p in parts]
        if self.stream is not None:
            if len({p["stream"] for p in parts}) != 1:  # would silently train each rank on another mix
                raise TrainingError(f"run {self.cfg.run_name}: step {state.global_step}: ranks drew different "
                                    "curriculum streams")
            self.stream.observe(batch, step_totals(self._reward_parts, [p["groups"] for p in parts]))

    def on_log(self, args, state, control, logs=None, **kw):
        logs = dict(logs or {})
        if self._reward_parts is not None:
            logs.update(merge_summaries(self._reward_parts))
            self._reward_parts = None
            weights = self.stream.weights(state.global_step - 1) if self.stream is not None else None
            logs.update({f"weight/{name}": w for name, w in (weights or {}).items()})
        if not self.main or "loss" not in logs and "train_loss" not in logs:
            return
        now = time.perf_counter()
        logs["step_time_s"] = getattr(self, "_last_step_time", now - self._t_log)
        self._phases(logs)
        tokens = logs.get("num_tokens")
        if tokens is not None and self._tokens_at_log is not None and now > self._t_log:
            logs["tokens_per_s"] = (tokens - self._tokens_at_log) / (now - self._t_log)
        self._tokens_at_log, self._t_log = tokens, now
        row = {"step": state.global_step, **{k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}}
        self.history.append(row)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        if "loss" in row:
            print(progress_line(self.cfg.mode, state.global_step, state.max_steps, row, now - self._t_begin,
                                state.global_step - self._step_begin), flush=True)
        if self.mlflow_run is not None:
            # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
            import mlflow

            with outage_named(f"the metrics of {self.cfg.mode} step {state.global_step}"):
                mlflow.log_metrics({k.replace("/", "_") if k.startswith(("reward/", "pass_rate/", "none_rate/", "weight/"))
                                    else k: v for k, v in row.items() if k != "step"}, step=state.global_step)
                self._log_trajectories(state.global_step)

    def _phases(self, logs: dict) -> None:
        """Rank 0's rollout and training-phase seconds of the step just logged, and the training phase's MFU
        (``temper.training.throughput``; on GPUs of known peak, with logging_steps 1 as temper sets it)."""
        train_s = logs["step_time_s"]
        if self.rollouts is not None:
            logs["rollout_s"] = self.rollouts.take()
            train_s = max(0.0, train_s - logs["rollout_s"])
        logs["train_phase_s"] = train_s
        tokens = logs.get("num_tokens")
        if self.peak_flops and tokens is not None and self._tokens_at_step is not None and train_s > 0 and self.params:
            logs["mfu"] = model_flops_utilization(self.params, tokens - self._tokens_at_step, train_s, self.peak_flops,
                                                  self.cfg.world_size)
        if tokens is not None:
            self._tokens_at_step = tokens

    def _log_trajectories(self, step: int) -> None:
        """The first ``SAMPLED_TRAJECTORIES`` episodes per multi-step domain that the ranks of this machine
        recorded since the last logging step (``<output_dir>/trajectories/rank<k>.jsonl``), each a readable
        page under ``trajectories/step-<step>/`` of the run."""
        # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
        import mlflow

        lines = []
        for path in sorted((self.out / "trajectories").glob("rank*.jsonl")):
            new, self._trajectories_read[path] = trajectories.read_new(path, self._trajectories_read.get(path, 0))
            lines += new
        for i, t in enumerate(trajectories.first_per_domain(lines, SAMPLED_TRAJECTORIES)):
            mlflow.log_text(trajectories.markdown(t), f"trajectories/step-{step:05d}/{trajectories.artifact_name(t, i)}")

    def on_save(self, args, state, control, **kw):
        dist = _dist()
        if dist is not None:
            dist.barrier()  # every rank has written its partitions and RNG state
        directory = self.out / f"checkpoint-{state.global_step}"
        if self.local_main and directory.is_dir():  # one uploader per machine: its ranks' partitions
            ckpt.write_state(directory, self.cfg, self.sampler_state(state.global_step), self.digests,
                             state.global_step)
            ckpt.sync_to_store(self.cfg, directory, self.settings, commit=False)
        if dist is not None:
            dist.barrier()  # every machine's partitions are in the store
        if _rank() == 0 and directory.is_dir():  # one committer per run (see sync_to_store)
            uri = ckpt.commit_to_store(self.cfg, directory, self.settings)
            print(f"temper: checkpoint step {state.global_step} synced to {uri}", flush=True)
        if dist is not None:
            dist.barrier()

    def finish(self, result: dict[str, Any]) -> None:
        """Rank 0: reward-curve artifact, model folder logged and registered."""
        if self.mlflow_run is None:
            return
        with outage_named(f"the end of {self.cfg.mode} run {self.cfg.run_name}"):
            self._finish(result)

    def _finish(self, result: dict[str, Any]) -> None:
        # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
        import mlflow

        png = reward_curve_png(self.out / "metrics.jsonl", self.out / "reward_curve.png")
        if png is not None:
            mlflow.log_artifact(str(png))
        rows = read_metrics(self.out / "metrics.jsonl")
        heatmap = domain_heatmap_png(rows, self.out / "reward_heatmap.png")
        if heatmap is not None:
            mlflow.log_artifact(str(heatmap))
            mlflow.log_text(domain_table_csv(rows), "per_domain_rewards.csv")
        weights = curriculum_weights_csv(rows)
        if weights is not None:
            mlflow.log_text(weights, "curriculum_weights.csv")
            heatmap = domain_heatmap_png(rows, self.out / "curriculum_weights.png", prefix="weight/",
                                         title="curriculum sampling weight per domain and step")
            if heatmap is not None:
                mlflow.log_artifact(str(heatmap))
        if result.get("model_dir") and self.cfg.register_as:
            result["model_version"] = log_and_register(result["model_dir"], self.cfg.register_as)
        result.update(mlflow_run_id=self.mlflow_run.info.run_id, mlflow_experiment=self.cfg.mlflow_experiment,
                      tracking_uri=mlflow.get_tracking_uri())
        mlflow.end_run()
