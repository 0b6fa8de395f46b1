"""evaluate: a registered model version x a set of domains, as sharded eval jobs (per-domain results).

Results become child runs of an 'evaluate' lifecycle run and tags on the version, so a
version evaluated on a new domain later can be compared on it.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from infra.tracking.connection import configure
from infra.tracking.runs import close_run, open_run
from tasks.data import resolve_domains
from tasks.evaluation import evaluate as evaluate_suite
from tasks.evaluation import fetch_model, tag_version
from temper.core.errors import TemperError
from temper.core.settings import get_settings
from temper.core.tag_names import TAG_KIND, TAG_MODEL_VERSION
from temper.lifecycle.params import EvaluateParams
from temper.lifecycle.report import before_after_markdown


@flow(name="evaluate", log_prints=True)
def evaluate(params: EvaluateParams = EvaluateParams()) -> dict:
    logger = get_run_logger()
    backend = get_settings().backend  # where the eval jobs run: chosen once, as the flow run starts
    logger.info("backend: %s", backend)
    model = fetch_model(params.model_name, params.version)
    if params.eval.domains:
        suite = [r.name for r in resolve_domains(params.eval.domains)]
    else:
        suite = model["evaluated_domains"]
    if not suite:
        raise TemperError(f"{params.model_name}@{params.version} has no eval results yet: name the domains to evaluate")
    configure()
    run_id = open_run("evaluate", f"evaluate-{params.model_name}-v{model['version']}",
                     tags={TAG_KIND: "lifecycle", TAG_MODEL_VERSION: model["version"]})
    results = evaluate_suite(model["model_dir"], suite, params.eval, f"v{model['version']}", run_id, backend)
    tag_version(params.model_name, model["version"], results)
    means = {r["domain"]: r["mean_reward"] for r in results}
    markdown = (f"# evaluate {params.model_name} version {model['version']}\n\n"
                + before_after_markdown({}, means, None))
    create_markdown_artifact(markdown=markdown, key="evaluate-report", description="evaluate result")
    close_run(run_id)
    logger.info("%s v%s: %s", params.model_name, model["version"], means)
    return {"version": model["version"], "means": means, "run_id": run_id}
