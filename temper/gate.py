"""The evaluation gate: does a candidate beat the champion well enough to take its place?

Per-domain rule, so a model that gains on average but breaks one domain is held back:
- no domain may regress by more than ``max_regression`` (mean reward, absolute);
- the mean over domains must improve by at least ``min_improvement``;
- with no champion, the candidate passes if it clears ``min_reward`` on every domain.
A tie (improvement below ``min_improvement``) keeps the champion: churn costs more than it buys.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PromotionPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_improvement: float = Field(default=0.0, ge=0,
                                   description="Mean reward gain over the champion needed to promote (strictly more).")
    max_regression: float = Field(default=0.05, ge=0,
                                  description="Largest allowed drop in mean reward on any single domain.")
    min_reward: float = Field(default=0.0, ge=0, le=1,
                              description="Floor on every domain's mean reward when there is no champion yet.")
    alias: str = Field(default="champion", description="Alias set when the gate passes.")
    fallback_alias: str = Field(default="candidate", description="Alias set when it does not.")


class GateDecision(BaseModel):
    passed: bool
    reason: str
    deltas: dict[str, float] = Field(default_factory=dict)


def decide(candidate: dict[str, float], champion: dict[str, float] | None, policy: PromotionPolicy) -> GateDecision:
    """``candidate`` / ``champion``: domain -> mean reward on the same eval suite."""
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
    worst = min(common, key=lambda d: deltas[d])
    if deltas[worst] < -policy.max_regression:
        return GateDecision(passed=False, deltas=deltas,
                            reason=f"{worst} regressed by {-deltas[worst]:.3f} (> max_regression {policy.max_regression})")
    mean_delta = sum(deltas.values()) / len(deltas)
    if mean_delta <= policy.min_improvement:
        return GateDecision(passed=False, deltas=deltas,
                            reason=f"mean improvement {mean_delta:+.3f} does not exceed min_improvement "
                                   f"{policy.min_improvement} (tie keeps the champion)")
    return GateDecision(passed=True, deltas=deltas, reason=f"mean improvement {mean_delta:+.3f}; worst domain "
                                                          f"{worst} {deltas[worst]:+.3f}")
