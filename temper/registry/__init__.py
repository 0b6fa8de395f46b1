"""The model registry (MLflow): one module per concern.

- ``store``: the MLflow client, registry errors, versions as strings (the sqlite store returns
  ints where the REST server returns strings; everything here speaks strings).
- ``tags``: the eval summary on a version (``temper.eval.<domain>.<metric>``): write and parse.
- ``samples``: per-sample eval rewards (``eval/<domain>.jsonl``) and the lifecycle run's stage runs.
- ``versions``: resolve a version reference (number, alias, ``MODEL@ALIAS``, ``MODEL/VERSION``); list.
- ``lock``: a mutex in the store itself, so concurrent alias moves get distinct audit sequence numbers.
- ``audit``: the audit trail of an alias (events on registered-model tags) and its replay.
- ``aliases``: promote, rollback, and the flow's own alias move, all through the audit trail.
- ``bootstrap``: paired bootstrap of per-sample reward deltas (scipy.stats.bootstrap), Holm.
- ``gate``: the promotion policy and decision (per domain, noise-aware).
- ``compare``: per-domain comparison of two versions, its table and chart.
- ``registration``: what the post_training flow does (champion lookup, register a version).
- ``lineage_graph``: the lineage graph of a version (mermaid, DOT, PNG).

Nothing is imported here, so ``import temper.registry.tags`` stays cheap.
"""
