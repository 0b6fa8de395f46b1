"""post_training: the lifecycle DAG of one candidate model.

    resolve catalog -> validate contracts (mapped, cached by digest) -> lifecycle run
    -> SFT (optional) -> GRPO -> eval base (kept results reused) and candidate (eval jobs)
    -> champion lookup -> gate -> register version + alias -> report (Prefect + MLflow)

A contract violation ends the flow right after validation: no training task, no model
version, and the report says which domain broke which check. Any other failure once the
lifecycle run is open (a stage, the registry, the report) closes it FAILED with a report
naming the failed task (``fail_lifecycle``, a flow hook, so no stage can skip it). Every stage
is a task over plain functions (tasks/, temper/), so the flow reads as the lifecycle and nothing else.

A run whose flow run died (its process killed, the tracking server away past the retry budget) is
continued by `temper resume FLOW_RUN` (``temper/lifecycle/resume.py``): a new flow run with the same
parameters and ``continues`` set, so it works under the same run key and every stage finds what the
earlier attempt finished (records by key, the trained model, checkpoints to resume from).
"""

from __future__ import annotations

from prefect import flow, get_run_logger, unmapped
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from infra.tracking.connection import configure
from tasks.data import calibration_gate, resolve_domains, validate_domain
from tasks.evaluation import compare_to_base, evaluate
from tasks.registry import champion, close_lifecycle, fail_lifecycle, gate, open_lifecycle, register
from tasks.training import prepare_base_model, train_stage
from temper.core.errors import ContractViolation
from temper.data.catalog import split_by_role
from temper.lifecycle.params import PostTrainingParams
from temper.lifecycle.report import domain_csv, domain_rows, post_training_markdown, run_link, validation_markdown
from temper.lifecycle.resume import process_tag, run_key_of, run_tag
from temper.lifecycle.validation import validation_workers

REPORT_KEY = "post-training-report"


def _context(before: list[dict], after: list[dict]) -> dict[str, tuple[str, str]]:
    """Long-context domain -> (base, candidate) effective context length, for the report."""
    base = {r["domain"]: r["effective_context"] for r in before if "effective_context" in r}
    return {r["domain"]: (base.get(r["domain"], "n/a"), r["effective_context"]) for r in after if "effective_context" in r}


def _format_rates(before: list[dict], after: list[dict]) -> dict[str, tuple[float, float]]:
    """domain -> (base, candidate) share of items scored 0 for answer format (no <answer> tag, ...)."""
    base = {r["domain"]: r.get("format_zero_rate", 0.0) for r in before}
    return {r["domain"]: (base.get(r["domain"], 0.0), r.get("format_zero_rate", 0.0)) for r in after}


def _means(results: list[dict]) -> dict[str, float]:
    return {r["domain"]: r["mean_reward"] for r in results}


def _lifecycle_link(run_id: str) -> str:
    # lazy: mlflow (1.6 s) would load whenever flows.retrain is imported
    from mlflow.tracking import MlflowClient

    uri = configure()
    return run_link(uri, MlflowClient().get_run(run_id).info.experiment_id, run_id)


def _record_run(run_key: str) -> None:
    """This process as the flow run's ``infrastructure_pid`` (unless a worker set its own), so that
    `temper resume` can tell a run whose process died from one that still runs; and the run key as a
    tag, so it can tell a run that a continuation already finished."""
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.get_id())
        client.update_flow_run(run.id, infrastructure_pid=run.infrastructure_pid or process_tag(),
                               tags=sorted({*run.tags, run_tag(run_key)}))


@flow(name="post_training", log_prints=True, on_failure=[fail_lifecycle], on_crashed=[fail_lifecycle])
def post_training(params: PostTrainingParams = PostTrainingParams(), continues: str | None = None) -> dict:
    """The lifecycle of one candidate model.

    Args:
        params: the run's parameters.
        continues: set by `temper resume`: the flow run that started the post_training run this flow
            run continues (its run key, checkpoints and MLflow records). Empty for a new run.
    """
    logger = get_run_logger()
    run_key = run_key_of(flow_run.get_id(), continues)
    if flow_run.get_id():
        _record_run(run_key)
    if continues:
        logger.info("continuing post_training run %s (started by flow run %s)", run_key, continues)
    logger.info("run key %s; should this process die: temper resume %s", run_key, flow_run.get_id())
    # The one choice of where jobs run (temper.lifecycle.execution): launcher, file locations, sandboxes.
    params = params.resolved()
    logger.info("backend: %s", params.backend)
    held_names = {r.name for r in resolve_domains(params.held_out)} if params.held_out else set()
    refs, gated_weights, uncalibrated = calibration_gate(resolve_domains(params.domains + params.held_out),
                                                         params.mixing_weights)
    # the chosen eval suite is resolved now: a misspelt eval domain fails before any compute is spent on training
    suite_refs = resolve_domains(params.eval.domains) if params.eval.domains else []
    for name, reason in uncalibrated.items():
        logger.warning("domain %s %s", name, reason)
    reports = validate_domain.map(refs, unmapped(validation_workers(len(refs)))).result()
    domains = [r.domain for r in reports]
    eval_only = frozenset(r.name for r in refs if r.role == "eval" or r.name in held_names)
    lifecycle_run_id = open_lifecycle(params, run_key, reports, eval_only)
    validation = validation_markdown(reports) + "".join(
        f"\n\nJudge domain {n} {why}" for n, why in uncalibrated.items())
    report = dict(flow_run=run_key, domains=domains, validation=validation,
                  lifecycle_link=_lifecycle_link(lifecycle_run_id))

    failed = [r for r in reports if not r.success]
    if failed:
        why = "; ".join(f"{r.domain}: " + (r.error or ", ".join(f"{f.check} on {f.column}" for f in r.failures))
                        for r in failed)
        markdown = post_training_markdown(**report, before={}, after={}, champion=None, champion_version=None,
                                          decision="", registered=None, stopped=f"Data contract violation: {why}")
        create_markdown_artifact(markdown=markdown, key=REPORT_KEY, description="post_training stopped")
        close_lifecycle(lifecycle_run_id, "FAILED", markdown)
        raise ContractViolation(f"{len(failed)} domain(s) violate their data contract: {why}")

    # the run's held_out domains are eval-only for this run, whatever their catalog role
    trainable, default_suite = split_by_role(domains, {r.name: "eval" if r.name in held_names else r.role
                                                      for r in refs})
    held_out = [n for n in domains if n not in trainable]
    if held_out:
        logger.info("eval-only domain(s) %s: validated and evaluated, never trained", ", ".join(held_out))
    if uncalibrated or held_out:  # train exactly the trainable domains that passed the calibration gate
        params = params.model_copy(update={"domains": trainable, "mixing_weights": {
            n: w for n, w in params.mixing_weights.items() if n in trainable}})
        gated_weights = {n: w for n, w in gated_weights.items() if n in trainable}  # a held-out judge domain's
    base = prepare_base_model(params.base_model)
    model = base
    # training refuses a dataset whose bytes are not the ones its contract passed (changed since validation)
    validated = {r.domain: r.digest for r in reports if r.domain in trainable and r.digest}
    if params.sft.enabled:
        model = train_stage("sft", params, model, run_key, lifecycle_run_id, validated_digests=validated)
    # GRPO samples each domain at the weight the calibration gate left it (a down-weighted judge domain: x factor)
    model = train_stage("grpo", params, model, run_key, lifecycle_run_id, mixing_weights=gated_weights,
                        validated_digests=validated)

    # default suite: every validated domain that has held-out data (eval-only ones included)
    suite = default_suite
    if params.eval.domains:  # a chosen suite, and the held-out domains, which are there to be evaluated
        suite = sorted({r.name for r in suite_refs} | (held_names & set(domains)))
    # the base model's result per domain, keyed by the dataset digests resolved when the run started
    digests = {r.name: r.digest for r in [*refs, *suite_refs] if r.digest} if params.eval.reuse_base else None
    before = evaluate.submit(base, suite, params.eval, "base", lifecycle_run_id, params.backend, digests)
    after = evaluate.submit(model, suite, params.eval, "candidate", lifecycle_run_id, params.backend)
    before, after = before.result(), after.result()
    # what training did, per domain, with intervals (paired bootstrap, Holm): the report's table
    versus_base = compare_to_base(before, after, trainable, params.promotion.significance)

    champion_version, champion_means = champion(params.model_name, params.promotion.alias)
    decision = gate(after, params.model_name, champion_version, champion_means, params.promotion)
    registered = register(params, model, lifecycle_run_id, {r["domain"]: r for r in after}, decision)
    logger.info("registered %s version %s as @%s: %s", registered["name"], registered["version"],
                registered["alias"], decision.reason)

    markdown = post_training_markdown(**report, before=_means(before), after=_means(after), champion=champion_means,
                                      champion_version=champion_version, decision=decision.reason,
                                      registered=registered, context=_context(before, after), versus_base=versus_base)
    create_markdown_artifact(markdown=markdown, key=REPORT_KEY, description="post_training result")
    rows = domain_rows(_means(before), _means(after), champion_means, versus_base, _format_rates(before, after))
    create_table_artifact(table=rows, key="post-training-domains", description="per-domain eval: base, candidate, delta")
    close_lifecycle(lifecycle_run_id, "FINISHED", markdown, domain_csv(rows), versus_base)
    return {"run_key": run_key, "lifecycle_run_id": lifecycle_run_id, "before": _means(before),
            "after": _means(after), "champion_before": champion_version, "gate": decision.model_dump(),
            "registered": registered, "versus_base": versus_base, "report": markdown}
