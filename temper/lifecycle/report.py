"""Markdown reports of flow runs: one text for the Prefect artifact and the MLflow artifact."""

from __future__ import annotations

import csv
import io

from data_contracts.report import DomainReport

# Past this many domains a report summarises; the full per-domain table goes to MLflow (CSV) and
# to a Prefect table artifact, where a person can sort and search it.
SUMMARY_THRESHOLD = 20
TOP_N = 10


def validation_markdown(reports: list[DomainReport]) -> str:
    lines = ["| domain | contract | rows | digest | result |", "|---|---|---:|---|---|"]
    shown = reports
    if len(reports) > SUMMARY_THRESHOLD:  # at hundreds of domains: the failures, and a count of the rest
        shown = [r for r in reports if not r.success or r.error]
        lines.insert(0, f"{len(reports) - len(shown)} of {len(reports)} domains pass their contract"
                        + ("; the others:\n" if shown else "."))
        if not shown:
            return lines[0]
    for r in shown:
        if r.error:
            result = f"error: {r.error}"
        elif r.success:
            result = "pass"
        else:
            result = "; ".join(f"{f.check} on {f.column}: {f.unexpected_count if f.unexpected_count is not None else f.observed}"
                               for f in r.failures)
            result = f"**FAIL** {result}"
        lines.append(f"| {r.domain} | {r.contract} | {r.rows} | `{r.digest[:12]}` | {result} |")
    return "\n".join(lines)


def domain_rows(before: dict[str, float], after: dict[str, float], champion: dict[str, float] | None,
                versus_base: dict | None = None,
                format_rates: dict[str, tuple[float, float]] | None = None) -> list[dict]:
    """One row per evaluated domain: base, candidate, delta (candidate - base), champion; with ``versus_base``
    (``compare_to_base``) the delta's paired interval and Holm verdict, and whether the domain was trained; with
    ``format_rates`` the share of items scored 0 for their answer format, base and candidate."""
    deltas = (versus_base or {}).get("domains", {})
    rows = []
    for d in sorted(after):
        b, c = before.get(d), (champion or {}).get(d)
        row = {"domain": d, "base": b, "candidate": after[d], "delta": None if b is None else after[d] - b,
               "champion": c}
        if versus_base is not None:
            x = deltas.get(d, {})
            row |= {"lo": x.get("lo"), "hi": x.get("hi"), "verdict": x.get("verdict", "-"),
                    "trained": d in versus_base.get("trained", [])}
        if format_rates is not None:
            row |= {"base_format_zero": format_rates.get(d, (None, None))[0],
                    "candidate_format_zero": format_rates.get(d, (None, None))[1]}
        rows.append(row)
    return rows


def domain_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    fields = list(dict.fromkeys(k for r in rows for k in r)) or ["domain", "base", "candidate", "delta", "champion"]
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def versus_base_markdown(versus_base: dict) -> str:
    """The run against its base: mean delta over trained and held-out domains with intervals, verdict counts."""
    lines = ["| domains | n | base | candidate | delta | 95% interval | better | unchanged | worse |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for group in ("trained", "held_out"):
        m, n = versus_base["means"].get(group), versus_base["counts"][group]
        if m is None:
            continue
        lines.append(f"| {group.replace('_', '-')} | {m['domains']} | {m['base']:.3f} | {m['candidate']:.3f} | "
                     f"{m['delta']:+.3f} | [{m['lo']:+.3f}, {m['hi']:+.3f}] | {n['better']} | {n['unchanged']} | "
                     f"{n['worse']} |")
    return "\n".join(lines + ["", "better / worse: the domain's paired delta is significant in a two-sided test, "
                               "Holm over the domains (a delta without spread: the sign test)."])


def before_after_markdown(before: dict[str, float], after: dict[str, float], champion: dict[str, float] | None) -> str:
    rows = domain_rows(before, after, champion)
    head = ["| domain | base | candidate | delta | champion |", "|---|---:|---:|---:|---:|"]

    def table(chosen: list[dict]) -> list[str]:
        return head + [f"| {r['domain']} | {_f(r['base'])} | {_f(r['candidate'])} | {_f(r['delta'], sign=True)} | "
                       f"{_f(r['champion'])} |" for r in chosen]

    if len(rows) <= SUMMARY_THRESHOLD:
        return "\n".join(table(rows))
    deltas = [r for r in rows if r["delta"] is not None]
    up = sum(r["delta"] > 1e-9 for r in deltas)
    down = sum(r["delta"] < -1e-9 for r in deltas)
    by_delta = sorted(deltas, key=lambda r: (r["delta"], r["domain"]))
    mean = sum(r["candidate"] for r in rows) / len(rows)
    lines = [f"{len(rows)} domains: **{up} improved, {down} regressed, {len(deltas) - up - down} unchanged** "
             f"(candidate vs base); mean candidate reward {mean:.3f}. The full table is `per_domain.csv` in the "
             "lifecycle run and the Prefect table artifact `post-training-domains`.", "",
             f"### Worst {min(TOP_N, len(by_delta))} by delta", ""] + table(by_delta[:TOP_N])
    lines += ["", f"### Best {min(TOP_N, len(by_delta))} by delta", ""] + table(by_delta[::-1][:TOP_N])
    return "\n".join(lines)


def _f(x: float | None, sign: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.3f}" if sign else f"{x:.3f}"


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """A clickable MLflow UI link when tracking is a server; else the run id and the UI command."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"[{run_id[:8]}]({tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id})"
    return f"`{run_id}` (`mlflow ui --backend-store-uri {tracking_uri}`)"


def post_training_markdown(*, flow_run: str, domains: list[str], validation: str, before: dict[str, float],
                           after: dict[str, float], champion: dict[str, float] | None, champion_version: str | None,
                           decision: str, registered: dict | None, lifecycle_link: str,
                           stopped: str | None = None, failed: str | None = None,
                           context: dict[str, tuple[str, str]] | None = None, versus_base: dict | None = None) -> str:
    """The post-training report: the same text goes to Prefect and to MLflow.

    ``stopped``: a data contract stopped the run before training; ``failed``: a stage failed
    after the lifecycle run opened (what failed and why); ``context``: long-context domain -> (base,
    candidate) effective context length, described.
    """
    if failed:
        return "\n".join([f"# post_training {flow_run}: FAILED", "", f"Lifecycle run: {lifecycle_link}", "",
                          "## Failed", "", failed, "", "The lifecycle run is closed as FAILED; no alias moved unless "
                          "the failure came after registration (see the registry's audit trail)."])
    listed = ", ".join(domains) if len(domains) <= SUMMARY_THRESHOLD else \
        f"{len(domains)} ({', '.join(domains[:5])}, ... {domains[-1]})"
    lines = [f"# post_training {flow_run}", "", f"Domains: {listed}", f"Lifecycle run: {lifecycle_link}", "",
             "## Data contracts", "", validation, ""]
    if stopped:
        lines += ["## Stopped before training", "", stopped, "", "No training ran and no model version was registered."]
        return "\n".join(lines)
    if versus_base:
        lines += ["## Candidate vs base", "", versus_base_markdown(versus_base), ""]
    lines += ["## Mean reward per domain (greedy, eval split)", "", before_after_markdown(before, after, champion), "",
              f"Champion before this run: {f'version {champion_version}' if champion_version else 'none'}", ""]
    if context:
        lines += ["## Effective context length", "", "| domain | base | candidate |", "|---|---|---|"]
        lines += [f"| {d} | {b} | {a} |" for d, (b, a) in sorted(context.items())] + [""]
    lines += ["## Gate", "", decision, ""]
    if registered:
        lines += ["## Registered", "", f"`{registered['name']}` version **{registered['version']}**, alias "
                  f"**{registered['alias']}**", ""]
    return "\n".join(lines)
