"""MLflow tag names have one home, ``temper.core.tag_names``: no other module spells one itself.

A tag spelled twice drifts (``temper.stage`` and ``temper.domain`` were each defined in two modules);
a reader that misspells one finds nothing, silently. Here every string literal of the tree that starts
with ``temper.`` (or names a tag in an MLflow filter, ``tags.`temper.x```) is found with ``ast``
(docstrings and other bare strings aside) and must be one of the few that are no MLflow tag.
"""

from __future__ import annotations

import ast
from pathlib import Path

from temper.core import tag_names

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("temper", "infra", "tasks", "flows", "workloads", "benchmarks", "data_contracts")
HOME = Path("temper/core/tag_names.py")

# (file, literal) -> why it is no MLflow tag
NOT_TAGS = {
    ("tasks/events.py", "temper.dataset.changed"): "the Prefect event a changed dataset emits",
    ("tasks/events.py", "temper.dataset."): "the Prefect resource id of a domain's dataset",
    ("tasks/events.py", "temper.domain"): "a label of that Prefect resource",
    ("temper/agent/trajectories.py", "temper.trajectory/1"): "the format id of a trajectory file",
    ("temper/training/run.py", "temper.train"): "a logger name",
    ("temper/cli.py", "temper.commands."): "the module of a CLI command group",
    ("benchmarks/domains_at_scale.py", "temper.cli"): "a module run with python -m",
}
K8S_LABEL = "temper.dev/"  # Kubernetes label keys (infra/k8s/manifests.py), not MLflow tags


def literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each string literal a value is made of: constants and the fixed parts of f-strings,
    not bare expression statements (docstrings, attribute docstrings)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bare = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare]


def spells_a_tag(text: str) -> bool:
    return (text.startswith("temper.") and not text.startswith(K8S_LABEL)) or "`temper." in text


def test_no_module_but_tag_names_spells_a_temper_tag():
    found = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO)
            if rel == HOME:
                continue
            found += [f"{rel}:{line}: {text!r}" for line, text in literals(path)
                      if spells_a_tag(text) and (rel.as_posix(), text) not in NOT_TAGS]
    assert not found, "tag names belong in temper/core/tag_names.py:\n" + "\n".join(found)


def test_the_allow_list_names_only_literals_that_exist():
    """An entry whose literal is gone would let a tag of the same spelling back in unnoticed."""
    stale = [key for key in NOT_TAGS if key[1] not in {t for _, t in literals(REPO / key[0])}]
    assert not stale


# constant  wire name: the strings records are written under
WIRE_NAMES = """
PREFIX                        temper.
TAG_KIND                      temper.kind
TAG_STAGE                     temper.stage
TAG_GIT                       temper.git_commit
TAG_CONFIG_HASH               temper.config_hash
TAG_BASE_MODEL                temper.base_model
TAG_RECORD                    temper.record
TAG_FLOW_RUN                  temper.prefect_flow_run
TAG_FAILED_STAGE              temper.failed_stage
TAG_DATA_VALIDATION           temper.data.validation
TAG_DOMAIN                    temper.domain
TAG_EVAL_LABEL                temper.eval.label
TAG_EVAL_REUSED_FROM          temper.eval.reused_from
TAG_CONTEXT_CURVE             temper.eval.context_curve
TAG_EFFECTIVE_CONTEXT         temper.eval.effective_context
TAG_MODEL_VERSION             temper.model_version
TAG_COMPARE_MODEL             temper.model
TAG_COMPARE_A                 temper.compare.a
TAG_COMPARE_B                 temper.compare.b
TAG_CALIBRATION_STATUS        temper.calibration.status
TAG_CALIBRATION_REASON        temper.calibration.reason
TAG_RUBRIC                    temper.rubric_digest
TAG_JUDGE                     temper.judge
TAG_LABELS                    temper.labels_sha256
TAG_LIFECYCLE_RUN             temper.lifecycle_run
TAG_FORMAT                    temper.format
TAG_GATE_PASSED               temper.gate.passed
TAG_GATE_REASON               temper.gate.reason
TAG_GATE_DELTAS               temper.gate.deltas
TAG_CANDIDATE_REASON          temper.candidate_reason
EVAL_PREFIX                   temper.eval.
EVAL_TAG                      temper.eval.{domain}.{metric}
VERSION_AUDIT_TAG             temper.audit.{alias}
AUDIT_TAG                     temper.audit.{alias}.{seq:06d}
TAG_SERVING_PROFILE           temper.serving.profile
TAG_SERVING_DRAFT             temper.serving.draft
TAG_SERVING_STANDARD_VERSION  temper.serving.standard_version
PARITY_TAG                    temper.parity.{field}
TAG_LOCK_OWNER                temper.lock.owner
TAG_LOCK_SINCE                temper.lock.since
TAG_SHA256                    temper.sha256
DATA_CONTEXT                  mlflow.data.context
CONTEXT_TRAINING              training
CONTEXT_EVALUATION            evaluation
CONTEXT_VALIDATION            validation
CONTEXT_CALIBRATION           calibration
PARENT_TAG                    mlflow.parentRunId
RUN_NAME_TAG                  mlflow.runName
"""


def test_the_tag_names_on_the_wire():
    """The strings themselves: records already written are found again only under these names, so a rename
    here must be deliberate (and migrate the stores)."""
    wire = dict(line.split() for line in WIRE_NAMES.strip().splitlines())
    assert {k: v for k, v in vars(tag_names).items() if k.isupper()} == wire
