"""Every MLflow tag name temper writes or reads, in one place: what a tag means is decided here.

The names are the wire format of temper's records: runs, model versions, registered models and
logged datasets are found again by them (``temper resume``, ``temper lineage``, the gate, the
retrain trigger), so a name that changes here changes for every writer and reader at once, and
records written under the old name are no longer found. ``tests/unit/test_tag_names.py`` pins the
strings and fails when another module of the tree spells one itself.

Names with a placeholder (``{domain}``, ``{alias}``, ...) are templates for a family of tags.
"""

from __future__ import annotations

PREFIX = "temper."
"""What every temper tag starts with: the lineage tree keeps a run's tags under it, and only those."""

# ---- on MLflow runs -------------------------------------------------------------------------

TAG_KIND = "temper.kind"
"""What a run records: ``lifecycle`` (a flow run's parent), ``stage``, ``ops`` (compare) or ``calibration``."""
TAG_STAGE = "temper.stage"
"""The stage a run records: validate, sft, grpo, eval, register (or compare, on an ops run)."""
TAG_GIT = "temper.git_commit"
"""The commit of the code that made the run or version (``-dirty`` when the tree had local changes)."""
TAG_CONFIG_HASH = "temper.config_hash"
"""A short hash of the run's config (flow parameters or training config)."""
TAG_BASE_MODEL = "temper.base_model"
"""The base model a lifecycle started from (on its lifecycle run and on the version it registered)."""
TAG_RECORD = "temper.record"
"""The deterministic key a run is found by again (find-or-create on resume and retry)."""
TAG_FLOW_RUN = "temper.prefect_flow_run"
"""On a lifecycle run: the Prefect flow run that last worked on it."""
TAG_FAILED_STAGE = "temper.failed_stage"
"""On a lifecycle run that failed: the tasks that failed (or "the flow itself")."""
TAG_DATA_VALIDATION = "temper.data.validation"
"""``pass`` or ``fail``: the contract checks of the run's datasets; written last when a lifecycle run opens."""
TAG_DOMAIN = "temper.domain"
"""The domain an eval run or a judge calibration run is about."""
TAG_EVAL_LABEL = "temper.eval.label"
"""On an eval run: ``base`` or ``candidate``, which model of the lifecycle it scored."""
TAG_EVAL_REUSED_FROM = "temper.eval.reused_from"
"""On an eval run whose result was not computed again: the eval run that computed it (same model, data, code)."""
TAG_CONTEXT_CURVE = "temper.eval.context_curve"
"""``true`` on eval runs whose samples carry their prompt lengths (long-context domains)."""
TAG_EFFECTIVE_CONTEXT = "temper.eval.effective_context"
"""On a long-context eval run: its effective context length, described."""
TAG_MODEL_VERSION = "temper.model_version"
"""On an evaluate flow's lifecycle run: the version it evaluated."""
TAG_COMPARE_MODEL = "temper.model"
"""On a compare run: the registered model whose versions it compares."""
TAG_COMPARE_A = "temper.compare.a"
"""On a compare run: the first version compared."""
TAG_COMPARE_B = "temper.compare.b"
"""On a compare run: the second version compared."""
TAG_CALIBRATION_STATUS = "temper.calibration.status"
"""On a judge calibration run: ``verified`` or ``unverified``."""
TAG_CALIBRATION_REASON = "temper.calibration.reason"
"""On a judge calibration run: the thresholds it missed, ``;``-separated (empty when verified)."""
TAG_RUBRIC = "temper.rubric_digest"
"""On a judge calibration run: the digest of the rubric the judge scored with."""
TAG_JUDGE = "temper.judge"
"""On a judge calibration run: which judge was calibrated."""
TAG_LABELS = "temper.labels_sha256"
"""On a judge calibration run: the sha256 of the human labels it was calibrated against."""

# ---- on model versions (and the logged models behind them) ----------------------------------

TAG_LIFECYCLE_RUN = "temper.lifecycle_run"
"""The lifecycle run that registered the version: one version per lifecycle run."""
TAG_FORMAT = "temper.format"
"""How the version's model is stored (``mlflow-transformers``)."""
TAG_GATE_PASSED = "temper.gate.passed"
"""``true`` or ``false``: the promotion gate's verdict on the version."""
TAG_GATE_REASON = "temper.gate.reason"
"""The promotion gate's reason, one line."""
TAG_GATE_DELTAS = "temper.gate.deltas"
"""The promotion gate's per-domain deltas against the champion, JSON."""
TAG_CANDIDATE_REASON = "temper.candidate_reason"
"""On a version that did not pass the gate: why it was aliased as the fallback instead."""
EVAL_PREFIX = "temper.eval."
"""What the eval summary tags on a version start with (``temper.registry.tags`` writes and parses them)."""
EVAL_TAG = EVAL_PREFIX + "{domain}.{metric}"
"""One number of a version's eval summary: mean_reward, pass_rate or n of a domain."""
VERSION_AUDIT_TAG = "temper.audit.{alias}"
"""On the version an alias moved to: that move's audit event, JSON."""
TAG_SERVING_PROFILE = "temper.serving.profile"
"""``standard`` or ``fast``: the serving profile a version registers."""
TAG_SERVING_DRAFT = "temper.serving.draft"
"""On a fast serving version: the draft model of its speculative decoding."""
TAG_SERVING_STANDARD_VERSION = "temper.serving.standard_version"
"""On a fast serving version: the standard version its parity was measured against."""
PARITY_TAG = "temper.parity.{field}"
"""On a fast serving version: one field of its parity report (passed, reason, speedup, detail, ...)."""

# ---- on registered models -------------------------------------------------------------------

AUDIT_TAG = VERSION_AUDIT_TAG + ".{seq:06d}"
"""One event of an alias's audit trail, JSON, numbered in order."""
TAG_LOCK_OWNER = "temper.lock.owner"
"""On a registry lock (a registered model of its own): the token of the holder."""
TAG_LOCK_SINCE = "temper.lock.since"
"""On a registry lock: when it was taken (Unix time), so a crashed holder's lock can be broken."""

# ---- on logged datasets: tags and contexts --------------------------------------------------

TAG_SHA256 = "temper.sha256"
"""The dataset's full sha256 (MLflow's digest column holds only its first 32 hex digits)."""
DATA_CONTEXT = "mlflow.data.context"
"""MLflow's own dataset tag: the context a dataset was logged in (one of the ``CONTEXT_*`` below)."""
CONTEXT_TRAINING = "training"
"""A dataset the run trained on: what ``retrain`` compares digests of."""
CONTEXT_EVALUATION = "evaluation"
"""A dataset the lifecycle only evaluated on (held out, or eval-only in the catalog)."""
CONTEXT_VALIDATION = "validation"
"""A dataset a validation stage checked against its contract."""
CONTEXT_CALIBRATION = "calibration"
"""Human labels a judge was calibrated against."""

# ---- MLflow's own run tags that temper sets or reads ----------------------------------------

PARENT_TAG = "mlflow.parentRunId"
"""The parent run of a run: stage runs hang under their lifecycle run by it."""
RUN_NAME_TAG = "mlflow.runName"
"""A run's display name."""
