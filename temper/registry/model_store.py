"""A model version's files in MLflow: written as a `transformers` logged model, read back as an HF folder.

Why a logged model and not plain artifacts: MLflow then knows what the files are. The version's
source is ``models:/<model_id>``, so ``mlflow.transformers.load_model("models:/NAME@champion")``
gives a text-generation pipeline, ``mlflow models serve --env-manager local -m models:/NAME@champion``
serves it (input example, signature and inference config are stored with it), and the MLflow UI
lists it under the register run's logged models with its eval metrics, each tied to its dataset.

Two layouts exist in a registry, and every reader goes through :func:`hf_folder`:

- logged model (this module): ``MLmodel``, ``model/`` (config + safetensors), ``components/tokenizer/``;
- plain artifacts (versions registered before issue 16): the HF folder itself under the run's ``model/``.

Eval jobs and ``temper serve`` want one plain HF folder (``from_pretrained(dir)`` for model and
tokenizer), which :func:`hf_folder` makes from either layout.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard

from temper.core.chat import PROMPT_FORMAT, chat_prompt
from temper.core.errors import TrackingError

TASK = "text-generation"
DEFAULT_EXAMPLE = "1 + 2 = "
# What the served model needs at inference; `mlflow models serve --env-manager local` installs
# nothing, but these pins say which stack the version was written with.
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors")


@dataclass(frozen=True)
class LoggedModel:
    model_id: str
    model_uri: str  # models:/<model_id>, the version's source
    run_id: str | None = None  # the run it was logged under (the register stage run)


@dataclass(frozen=True)
class EvalMetrics:
    """One domain's eval numbers and the dataset they were measured on (None: unknown)."""

    domain: str
    metrics: dict[str, float]
    dataset_uri: str | None = None
    dataset_sha256: str | None = None


def _card(model_dir: Path, description: str) -> Any:
    """A model card written with the model: without one, MLflow asks the Hugging Face Hub for it."""
    return ModelCard(f"---\nlibrary_name: transformers\npipeline_tag: {TASK}\ntags: [temper]\n---\n"
                     f"# {model_dir.name}\n\n{description}\n")


def _dataset_entity(m: EvalMetrics) -> Any:
    """The MLflow dataset a metric refers to: name = domain, digest = sha256[:32] (as in lineage)."""
    # lazy: mlflow+pydantic_settings (1.7 s), via infra.tracking, would load in fast unit tests (test_domain_roles.py)
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.entities import Dataset

    from infra.tracking.runs import MLFLOW_DIGEST_LEN

    source = resolve_dataset_source(m.dataset_uri)
    return Dataset(name=m.domain, digest=m.dataset_sha256[:MLFLOW_DIGEST_LEN], source_type=source._get_source_type(),
                   source=source.to_json())


def log_hf_model(model_dir: str | Path, *, example_prompt: str = DEFAULT_EXAMPLE, max_new_tokens: int = 8,
                 evals: list[EvalMetrics] = (), params: dict[str, str] | None = None,
                 description: str = "Trained by temper.") -> LoggedModel:
    """Log an HF folder as a `transformers` logged model of the active run, with its eval metrics.

    Greedy decoding and ``max_new_tokens`` are the stored inference config (what eval used);
    a request may override them through the signature's params. Each domain's metrics are
    linked to the model and to that domain's eval dataset. Call inside an active MLflow run.
    """
    # lazy: mlflow+transformers (2.4 s) would load in fast unit tests (test_domain_roles.py)
    import mlflow
    from mlflow.models import infer_signature
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise TrackingError(f"{model_dir}: not an HF model folder (no config.json)")
    if mlflow.active_run() is None:
        raise TrackingError(f"cannot log {model_dir}: no active MLflow run")
    # The flavour's "path to a checkpoint" mode fails with transformers 5 (lazy pipeline classes), so
    # the components are loaded; save_pretrained writes the same tensors back.
    components = {"model": AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto"),
                  "tokenizer": AutoTokenizer.from_pretrained(model_dir)}
    inference = {"max_new_tokens": max_new_tokens, "do_sample": False, "return_full_text": False}
    # a request reaches the model as prompts did in training and eval: inside its chat template (temper.core.chat),
    # which the served pipeline applies itself (MLflow's prompt_template), so callers send the bare question
    template = chat_prompt(components["tokenizer"], "{prompt}")
    if template.count("{") != 1 or template.count("}") != 1:  # only the placeholder: MLflow formats the text
        template = "{prompt}"
    prompt_format = PROMPT_FORMAT if template != "{prompt}" else "plain text"
    signature = infer_signature([example_prompt], ["completion"],
                                params={"max_new_tokens": max_new_tokens, "do_sample": False, "temperature": 1.0})
    info = mlflow.transformers.log_model(
        components, name="model", task=TASK, signature=signature,
        input_example=([example_prompt], {"max_new_tokens": max_new_tokens}), model_config=inference,
        model_card=_card(model_dir, f"{description}\n\nPrompt format: {prompt_format}."), params=params,
        metadata={"temper_prompt_format": prompt_format},
        prompt_template=None if template == "{prompt}" else template,
        # the default requirement inference imports torchvision, which is not installed
        pip_requirements=[f"{p}=={dist_version(p)}" for p in REQUIREMENTS])
    for m in evals:
        dataset = _dataset_entity(m) if m.dataset_uri and m.dataset_sha256 else None
        mlflow.log_metrics(m.metrics, model_id=info.model_id, dataset=dataset)
    return LoggedModel(model_id=info.model_id, model_uri=info.model_uri, run_id=info.run_id)


def reusable_logged_model(c: Any, experiment_id: str, lifecycle_run: str) -> LoggedModel | None:
    """The logged model an earlier attempt to register this lifecycle run left behind, if whole.

    A retried register task would otherwise log the model again and leave the first one unlinked
    (a logged model no version points to). The newest READY one is reused; every other logged
    model of the lifecycle run (failed or half-written uploads, older duplicates) is deleted.
    Call only when no version of the lifecycle run exists yet (a version's model is never here).
    """
    attempts = sorted(c.search_logged_models([experiment_id], filter_string=f"params.lifecycle_run = '{lifecycle_run}'"),
                      key=lambda m: m.creation_timestamp, reverse=True)
    ready = [m for m in attempts if str(getattr(m.status, "name", m.status)) == "READY"]
    keep = ready[0] if ready else None
    for m in attempts:
        if m is not keep:
            c.delete_logged_model(m.model_id)
    return None if keep is None else LoggedModel(model_id=keep.model_id, model_uri=keep.model_uri,
                                                 run_id=keep.source_run_id)


def hf_folder(source: str, target: str | Path) -> Path:
    """The version at ``source`` (its ``mv.source``) as one plain HF folder at ``target``.

    Works for both layouts (see the module docstring). Already there (config.json present): kept.
    The download goes to ``<target>.partial`` first, so an interrupted fetch is never taken
    for a model.
    """
    # lazy: mlflow (1.6 s) would load in fast unit tests (test_domain_roles.py)
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    target = Path(target)
    if (target / "config.json").exists():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        local = Path(download_artifacts(artifact_uri=source, dst_path=str(partial)))
    except MlflowException as e:
        raise TrackingError(f"cannot download model {source}: {e.message.splitlines()[0]}") from None
    if (local / "MLmodel").exists():
        flavor = Model.load(str(local)).flavors.get("transformers")
        if flavor is None:
            raise TrackingError(f"model {source} has no transformers flavour (flavours: "
                                f"{', '.join(Model.load(str(local)).flavors)})")
        folder = local / flavor.get("model_binary", "model")
        for component in flavor.get("components", []):  # tokenizer files next to the weights
            for f in (local / "components" / component).iterdir():
                if not (folder / f.name).exists():
                    shutil.move(str(f), folder / f.name)
    elif (local / "config.json").exists():
        folder = local  # plain-artifact layout
    else:
        raise TrackingError(f"model {source}: neither an MLflow model (MLmodel) nor an HF folder (config.json)")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    shutil.move(str(folder), target)
    shutil.rmtree(partial, ignore_errors=True)
    return target
