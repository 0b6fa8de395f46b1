"""The promotion gate: does a candidate beat the champion well enough to take its place?

Per-domain rule, so a model that gains on average but breaks one domain is held back:
- a domain *regresses* when its mean reward drops by more than ``max_regression`` AND, where
  per-sample rewards of both models exist, the drop is significant: a paired bootstrap of the
  per-sample deltas gives each domain a one-sided p-value, and Holm's correction over all tested
  domains keeps the chance that noise alone flags *any* domain at ``significance``. Without it,
  300 domains of 64 items (standard error ~0.09 each) would see a "regression" in almost every
  run. Domains without samples (versions registered before samples were logged) fall back to
  the bare threshold;
- the mean over domains must improve by more than ``min_improvement``;
- a long-context domain must not lose effective context length: the candidate's bootstrap interval
  lying wholly below the champion's blocks promotion (``temper.registry.effective_context``);
- with no champion, the candidate passes if it clears ``min_reward`` on every domain.
A tie (improvement not above ``min_improvement``) keeps the champion: churn costs more than it buys.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Samples = list[tuple[str, float | None]]  # (eval record id, reward), as in temper.registry.samples
Curve = list[tuple[int, float | None]]  # (prompt tokens, reward), long-context domains only


class PromotionPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_improvement: float = Field(default=0.0, ge=0,
                                   description="Mean reward gain over the champion needed to promote (strictly more).")
    max_regression: float = Field(default=0.05, ge=0,
                                  description="Largest tolerated drop in mean reward on any single domain; a larger "
                                              "drop blocks promotion only if it is also significant (see significance).")
    min_reward: float = Field(default=0.0, ge=0, le=1,
                              description="Floor on every domain's mean reward when there is no champion yet.")
    significance: float = Field(default=0.05, gt=0, lt=1,
                                description="Family-wise error rate of the per-domain regression tests: the chance "
                                            "that noise alone flags any domain between two equal models.")
    correction: Literal["holm", "bonferroni", "none"] = Field(
        default="holm", description="Multiple-comparison correction over domains ('none' tests each at significance).")
    n_boot: int = Field(default=2000, ge=100, description="Bootstrap resamples per domain.")
    seed: int = Field(default=0, description="Seed of the bootstrap (the decision is reproducible).")
    alias: str = Field(default="champion", description="Alias set when the gate passes.")
    fallback_alias: str = Field(default="candidate", description="Alias set when it does not.")


class GateDecision(BaseModel):
    passed: bool
    reason: str
    deltas: dict[str, float] = Field(default_factory=dict)
    p_values: dict[str, float] = Field(default_factory=dict,
                                       description="One-sided bootstrap p-value of a drop, per tested domain.")
    regressed: list[str] = Field(default_factory=list)
    context: dict[str, str] = Field(default_factory=dict,
                                    description="Effective context length per long-context domain: candidate vs champion.")
    lost_context: list[str] = Field(default_factory=list)


def context_losses(candidate: dict[str, Curve], champion: dict[str, Curve], policy: "PromotionPolicy"
                   ) -> tuple[list[str], dict[str, str]]:
    """(long-context domains whose effective length the candidate lost beyond doubt, a line per domain)."""
    # lazy: scipy (800 ms), via effective_context, would load at every `temper` start-up (see regressions)
    from temper.registry.effective_context import effective_context, lost_context

    lost, lines = [], {}
    for d in sorted(set(candidate) & set(champion)):
        ours, theirs = (effective_context(c, seed=policy.seed) for c in (candidate[d], champion[d]))
        lines[d] = f"{ours.describe()} vs champion {theirs.describe()}"
        if lost_context(ours, theirs):
            lost.append(d)
    return lost, lines


def regressions(deltas: dict[str, float], candidate_samples: dict[str, Samples], champion_samples: dict[str, Samples],
                policy: PromotionPolicy) -> tuple[list[str], dict[str, float]]:
    """(domains that regressed, p-values of the tested ones); worst first."""
    # scipy.stats costs ~0.8 s to import (measured with -X importtime); PromotionPolicy is a field of
    # the flow parameters that every CLI command loads, so the statistics load only when a gate runs.
    # lazy: scipy+numpy (200 ms), via bootstrap, would load at every `temper` start-up
    from temper.registry.bootstrap import bonferroni, bootstrap_delta, holm

    p_values = {}
    for d in deltas:
        if d in candidate_samples and d in champion_samples:
            iv = bootstrap_delta(champion_samples[d], candidate_samples[d], n_boot=policy.n_boot,
                                 level=1 - policy.significance, seed=policy.seed)
            if iv is not None:
                p_values[d] = iv.p_worse()
    if policy.correction == "holm":
        significant = holm(p_values, policy.significance)
    elif policy.correction == "bonferroni":
        significant = bonferroni(p_values, policy.significance)
    else:
        significant = {d for d, p in p_values.items() if p <= policy.significance}
    regressed = [d for d in deltas if deltas[d] < -policy.max_regression and (d not in p_values or d in significant)]
    return sorted(regressed, key=lambda d: deltas[d]), p_values


def decide(candidate: dict[str, float], champion: dict[str, float] | None, policy: PromotionPolicy,
           candidate_samples: dict[str, Samples] | None = None,
           champion_samples: dict[str, Samples] | None = None,
           candidate_curves: dict[str, Curve] | None = None,
           champion_curves: dict[str, Curve] | None = None) -> GateDecision:
    """``candidate`` / ``champion``: domain -> mean reward on the same eval suite; ``*_samples``:
    domain -> per-sample (id, reward), for the significance test (optional, per domain); ``*_curves``:
    domain -> (prompt tokens, reward) of long-context domains, for the effective context length."""
    if not candidate:
        return GateDecision(passed=False, reason="no eval results for the candidate")
    if champion is None:
        low = {d: r for d, r in candidate.items() if r < policy.min_reward}
        if low:
            worst = min(low, key=low.get)
            return GateDecision(passed=False, reason=f"no champion; {worst} mean reward {low[worst]:.3f} "
                                                     f"< min_reward {policy.min_reward}")
        return GateDecision(passed=True, reason="no champion yet; candidate clears min_reward on every domain")
    common = sorted(set(candidate) & set(champion))
    if not common:
        return GateDecision(passed=False, reason="candidate and champion share no evaluated domain")
    deltas = {d: candidate[d] - champion[d] for d in common}
    regressed, p_values = regressions(deltas, candidate_samples or {}, champion_samples or {}, policy)
    lost, context = context_losses(candidate_curves or {}, champion_curves or {}, policy)
    base = dict(deltas=deltas, p_values=p_values, regressed=regressed, context=context, lost_context=lost)
    if regressed:
        worst = regressed[0]
        why = f" (p={p_values[worst]:.2g}, {policy.correction}-corrected over {len(p_values)} domain(s))" \
            if worst in p_values else ""
        more = f"; {len(regressed) - 1} more domain(s) regressed" if len(regressed) > 1 else ""
        return GateDecision(passed=False, **base, reason=f"{worst} regressed by {-deltas[worst]:.3f} "
                                                         f"(> max_regression {policy.max_regression}){why}{more}")
    if lost:
        more = f"; {len(lost) - 1} more domain(s) lost context" if len(lost) > 1 else ""
        return GateDecision(passed=False, **base, reason=f"{lost[0]} lost effective context: {context[lost[0]]}{more}")
    mean_delta = sum(deltas.values()) / len(deltas)
    if mean_delta <= policy.min_improvement:
        return GateDecision(passed=False, **base, reason=f"mean improvement {mean_delta:+.3f} does not exceed "
                                                         f"min_improvement {policy.min_improvement} (tie keeps the champion)")
    worst = min(common, key=lambda d: deltas[d])
    return GateDecision(passed=True, **base, reason=f"mean improvement {mean_delta:+.3f}; worst domain "
                                                    f"{worst} {deltas[worst]:+.3f}")
