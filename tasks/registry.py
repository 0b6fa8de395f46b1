"""Prefect tasks around the model registry: champion lookup, gate, registration, lineage records."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.logging.loggers import flow_run_logger
from prefect.runtime import flow_run

from data_contracts.report import DomainReport
from infra.storage import local_folder
from infra.tracking.connection import configure, is_outage, outage_named
from infra.tracking.runs import close_run, code_version, config_hash, open_keyed_run, resume_run
from tasks.tracking import MLFLOW_RETRY
from temper.core.errors import TemperError
from temper.core.settings import get_settings
from temper.core.tag_names import (
    CONTEXT_EVALUATION,
    CONTEXT_TRAINING,
    TAG_BASE_MODEL,
    TAG_CONFIG_HASH,
    TAG_DATA_VALIDATION,
    TAG_FAILED_STAGE,
    TAG_FLOW_RUN,
    TAG_FORMAT,
    TAG_GIT,
    TAG_KIND,
    TAG_LIFECYCLE_RUN,
    TAG_RECORD,
    TAG_SHA256,
    TAG_STAGE,
)
from temper.data.catalog import load_catalog
from temper.data.datasets import load_dataset
from temper.lifecycle.params import PostTrainingParams
from temper.lifecycle.report import post_training_markdown, run_link
from temper.lifecycle.resume import run_key_of
from temper.lifecycle.validation import log_validated_datasets
from temper.registry.gate import GateDecision, PromotionPolicy, decide
from temper.registry.model_store import DEFAULT_EXAMPLE, EvalMetrics, LoggedModel, log_hf_model, reusable_logged_model
from temper.registry.registration import (
    champion_curves,
    champion_metrics,
    champion_samples,
    lifecycle_version,
    register_version,
    run_curves,
    run_samples,
)


@task(**MLFLOW_RETRY)
@outage_named("the lifecycle run's opening")
def open_lifecycle(params: PostTrainingParams, run_name: str, reports: list[DomainReport],
                   eval_only: frozenset[str] = frozenset()) -> str:
    """The lifecycle parent run: config, tags, and every dataset consumed (with digests), in context 'training',
    or 'evaluation' for the ``eval_only`` domains (held out, or eval-only in the catalog): what `retrain` compares.

    Found again by the run key (``run_name``) when the run is continued (`temper resume`, a retry):
    one lifecycle run per post_training run, however many flow runs it took.
    """
    # lazy: mlflow (1.6 s) would load whenever flows.post_training is imported
    import mlflow
    from mlflow.tracking import MlflowClient

    settings = get_settings()
    configure(settings, wait=True)
    run_id, existed = open_keyed_run("post_training", run_name, run_name, tags={
        TAG_KIND: "lifecycle", TAG_CONFIG_HASH: config_hash(params),
        TAG_BASE_MODEL: params.base_model, TAG_FLOW_RUN: str(flow_run.get_id() or "local")})
    if existed:
        get_run_logger().info("lifecycle run %s (%s) continued", run_id, run_name)
        if TAG_DATA_VALIDATION in MlflowClient().get_run(run_id).data.tags:  # the tag is written last
            return run_id  # its params and datasets are the same run's: logged by the attempt that opened it
    catalog = load_catalog(settings.catalog_dir)
    with resume_run(run_id):
        mlflow.log_dict(params.model_dump(mode="json"), "params.json")
        for context, chosen in ((CONTEXT_TRAINING, [r for r in reports if r.domain not in eval_only]),
                                (CONTEXT_EVALUATION, [r for r in reports if r.domain in eval_only])):
            log_validated_datasets(chosen, [catalog[r.domain] for r in chosen], context, settings)
        mlflow.set_tag(TAG_DATA_VALIDATION, "pass" if all(r.success for r in reports) else "fail")
    return run_id


@task(**MLFLOW_RETRY)
@outage_named("the lifecycle run's closing")
def close_lifecycle(run_id: str, status: str, report_markdown: str, domain_table_csv: str | None = None,
                    versus_base: dict | None = None) -> None:
    """The report (and the per-domain table, as CSV) on the lifecycle run, which is then closed; with
    ``versus_base`` (``compare_to_base``) its summary as metrics and its whole record as JSON."""
    # lazy: mlflow (1.6 s) would load whenever flows.post_training is imported
    import mlflow

    with resume_run(run_id):
        mlflow.log_text(report_markdown, "report.md")
        if domain_table_csv:
            mlflow.log_text(domain_table_csv, "per_domain.csv")
        if versus_base:
            mlflow.log_dict(versus_base, "versus_base.json")
            mlflow.log_metrics(versus_base_metrics(versus_base))
    close_run(run_id, status)


def versus_base_metrics(versus_base: dict) -> dict[str, float]:
    """``trained.delta``, ``trained.delta_lo``, ``trained.better``, ... and ``held_out.*`` likewise."""
    out: dict[str, float] = {}
    for group in ("trained", "held_out"):
        m = versus_base["means"].get(group)
        if m:
            out |= {f"{group}.delta": m["delta"], f"{group}.delta_lo": m["lo"], f"{group}.delta_hi": m["hi"],
                    f"{group}.base": m["base"], f"{group}.candidate": m["candidate"]}
        out |= {f"{group}.{v}": float(n) for v, n in versus_base["counts"][group].items()}
    return out


def _failed_tasks(flow_run_id: str) -> list[str]:
    """Names of the failed/crashed task runs of a flow run (the stage that broke), oldest first."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    bad = [r for r in runs if r.state is not None and (r.state.is_failed() or r.state.is_crashed())]
    return [r.name for r in sorted(bad, key=lambda r: r.start_time or r.created)]


def fail_lifecycle(flow, flow_run, state) -> None:
    """Flow hook (on_failure / on_crashed): close the lifecycle run this flow run worked on as FAILED,
    with a report naming the failed task and the error, so no failure leaves it RUNNING.

    A hook, not a try/except in the flow body, so every stage is covered, including ones
    added later. A lifecycle run already closed (a data contract violation) is left alone.
    With the tracking server away (the failure itself, often) it says so in one line: `temper
    resume` reopens the lifecycle run and finishes it later.
    """
    try:
        _fail_lifecycle(flow_run, state)
    except Exception as e:
        reason = str(e) if isinstance(e, TemperError) or is_outage(e) else f"{type(e).__name__}: {e}"
        flow_run_logger(flow_run).warning("lifecycle run of %s left open (`temper resume %s` finishes it): %s",
                                          flow_run.id, flow_run.id, reason.splitlines()[0] if reason else "")


def _fail_lifecycle(flow_run, state) -> None:
    # lazy: mlflow (1.6 s) would load whenever flows.post_training is imported
    import mlflow

    uri = configure()  # no waiting: a failure from an outage has waited the budget already
    experiment = mlflow.get_experiment_by_name("post_training")
    if experiment is None:
        return
    key = run_key_of(flow_run.id, (flow_run.parameters or {}).get("continues"))
    open_runs = mlflow.search_runs([experiment.experiment_id], output_format="list",
                                   filter_string=f"tags.`{TAG_RECORD}` = '{key}' "
                                                 f"and attributes.status = 'RUNNING'")
    if not open_runs:
        return
    try:
        failed = ", ".join(_failed_tasks(flow_run.id)) or "the flow itself"
    except Exception as e:  # the report matters more than the task names
        failed = f"unknown ({type(e).__name__} reading task runs)"
    for run in open_runs:
        markdown = post_training_markdown(
            flow_run=run.info.run_name, domains=[], validation="", before={}, after={}, champion=None,
            champion_version=None, decision="", registered=None,
            lifecycle_link=run_link(uri, experiment.experiment_id, run.info.run_id),
            failed=f"{failed}: {state.message}")
        with resume_run(run.info.run_id):
            mlflow.log_text(markdown, "report.md")
            mlflow.set_tag(TAG_FAILED_STAGE, failed)
        close_run(run.info.run_id, "FAILED")


@task(**MLFLOW_RETRY)
@outage_named("the champion lookup")
def champion(model_name: str, alias: str) -> tuple[str | None, dict[str, float] | None]:
    configure(wait=True)
    return champion_metrics(model_name, alias)


@task(**MLFLOW_RETRY)
@outage_named("the promotion gate")
def gate(candidate: list[dict], model_name: str, champion_version: str | None,
         champion_means: dict[str, float] | None, policy: PromotionPolicy) -> GateDecision:
    """The promotion gate on the candidate's eval results vs the champion's, per-sample rewards included
    (the candidate's from its eval runs, the champion's from its lifecycle), so each domain's
    regression is judged against its noise."""
    configure(wait=True)
    means = {r["domain"]: r["mean_reward"] for r in candidate}
    return decide(means, champion_means, policy, run_samples(candidate), champion_samples(model_name, champion_version),
                  run_curves(candidate), champion_curves(model_name, champion_version))


def _eval_metrics(eval_results: dict[str, dict]) -> list:
    """Each domain's eval numbers with the dataset they were measured on (read from its eval run)."""
    # lazy: mlflow (1.6 s) would load whenever flows.post_training is imported
    from mlflow.tracking import MlflowClient

    client, out = MlflowClient(), []
    for d, r in eval_results.items():
        uri = sha = None
        if r.get("run_id"):
            run = client.get_run(r["run_id"])
            uri, sha = run.data.params.get("dataset_uri"), run.data.tags.get(TAG_SHA256)
        out.append(EvalMetrics(domain=d, metrics={f"eval.{d}.mean_reward": r["mean_reward"],
                                                  f"eval.{d}.pass_rate": r["pass_rate"]},
                               dataset_uri=uri, dataset_sha256=sha))
    return out


def _example_prompt(domains: list[str]) -> str:
    """The first eval prompt of the first domain: the logged model's input example."""
    try:
        domain = load_catalog(get_settings().catalog_dir)[domains[0]]
        frame = load_dataset(domain).frame
        rows = frame[frame[domain.split.column] == domain.split.eval]
        return domain.render_prompt(rows.iloc[0].to_dict()) if len(rows) else DEFAULT_EXAMPLE
    except (TemperError, KeyError, IndexError):
        return DEFAULT_EXAMPLE


def _log_model(params: PostTrainingParams, model_dir: str, parent_run_id: str, eval_results: dict[str, dict],
               decision: GateDecision, config_hash: str) -> LoggedModel:
    """The 'register' stage run under the lifecycle run (found again by its key: an earlier attempt's run
    that holds no whole logged model is reused, not left beside a second one), holding the logged model."""
    # lazy: mlflow (1.6 s) would load whenever flows.post_training is imported
    import mlflow

    model_dir = local_folder(model_dir)  # a store URI when the model was trained on a cluster
    run_id, _ = open_keyed_run("post_training", f"{parent_run_id}/register", "register",
                                       parent_run_id=parent_run_id,
                                       tags={TAG_KIND: "stage", TAG_STAGE: "register",
                                             TAG_BASE_MODEL: params.base_model,
                                             TAG_CONFIG_HASH: config_hash})
    with mlflow.start_run(run_id=run_id):
        return log_hf_model(model_dir, example_prompt=_example_prompt(list(eval_results) or params.domains),
                            max_new_tokens=params.eval.max_new_tokens, evals=_eval_metrics(eval_results),
                            params={"base_model": params.base_model, "config_hash": config_hash,
                                    "lifecycle_run": parent_run_id},
                            description=f"{params.model_name}, trained by temper's post_training flow "
                                        f"(lifecycle run {parent_run_id}); gate: {decision.reason}")


@task(**MLFLOW_RETRY)
@outage_named("the registration")
def register(params: PostTrainingParams, model_dir: str, parent_run_id: str, eval_results: dict[str, dict],
             decision: GateDecision) -> dict:
    """A 'register' stage run holding the logged model (transformers flavour), then the version and alias.

    Idempotent per lifecycle run, as its retries need: an earlier attempt's version is finished, not
    registered again; else its logged model is reused, not logged again (see reusable_logged_model).
    """
    # lazy: mlflow (1.6 s) would load whenever flows.post_training is imported
    from mlflow.tracking import MlflowClient

    configure(wait=True)
    c = MlflowClient()
    done = lifecycle_version(c, params.model_name, parent_run_id)
    if done is not None:
        source, run_id, model_id = done.source, done.run_id, None
    else:
        logged = (reusable_logged_model(c, c.get_run(parent_run_id).info.experiment_id, parent_run_id)
                  or _log_model(params, model_dir, parent_run_id, eval_results, decision, config_hash(params)))
        source, run_id, model_id = logged.model_uri, logged.run_id, logged.model_id
    return register_version(params.model_name, source, run_id, model_id=model_id,
                            eval_results=eval_results, decision=decision, alias=params.promotion.alias,
                            fallback_alias=params.promotion.fallback_alias,
                            tags={TAG_BASE_MODEL: params.base_model, TAG_GIT: code_version(),
                                  TAG_LIFECYCLE_RUN: parent_run_id, TAG_FORMAT: "mlflow-transformers"})
