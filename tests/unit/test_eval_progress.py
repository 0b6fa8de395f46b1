"""The eval job's per-domain progress bar: shown on a terminal, silent in logs and CI."""

from __future__ import annotations

import io

from workloads.evaluate import EvalResult, with_progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _results(n: int) -> list[EvalResult]:
    return [EvalResult(domain=f"d{i}", model="m", dataset_uri="u", dataset_sha256="s", n=4, scored=4,
                       mean_reward=i / 4, pass_rate=0.0) for i in range(n)]


def test_on_a_terminal_the_bar_counts_every_domain_and_names_the_last():
    out = Terminal()
    results = _results(3)
    assert list(with_progress(iter(results), len(results), file=out, mininterval=0)) == results
    shown = out.getvalue()
    assert "1/3" in shown and "2/3" in shown and "3/3" in shown
    assert "d2 0.500" in shown  # the domain just finished, with its mean reward


def test_in_logs_and_ci_nothing_is_drawn_and_results_pass_through():
    out = io.StringIO()  # not a TTY: what the eval task's captured output and CI logs are
    results = _results(3)
    assert list(with_progress(iter(results), len(results), file=out)) == results
    assert out.getvalue() == ""


def test_an_empty_shard_draws_nothing_and_ends():
    out = Terminal()
    assert list(with_progress(iter([]), 0, file=out)) == []
