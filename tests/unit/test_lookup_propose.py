"""Prompt lookup's proposal: the tokens after the latest earlier occurrence of the longest repeated suffix."""

from __future__ import annotations

from temper.rollout.lookup import propose


def test_the_longest_repeated_suffix_wins_and_the_latest_occurrence_is_copied():
    assert propose([1, 2, 3, 9, 4, 1, 2, 3], 2) == [9, 4]  # the 3-gram [1, 2, 3]
    assert propose([1, 2, 3, 9, 4, 3, 8, 2, 3], 2) == [9, 4]  # [2, 3] beats the later [3]
    assert propose([7, 1, 5, 1, 6, 1], 1) == [6]  # the latest [1]
    assert propose([4, 5, 6], 3) == [] and propose([1], 3) == [] and propose([1, 2, 1], 0) == []


def test_a_probe_needs_the_whole_n_gram_repeated_not_one_token():
    """After a back-off the decoder probes with min_ngram = max_ngram: a token seen before is not evidence of
    copying (in chat almost every token was), the last three repeated are."""
    one_token = [5, 1, 7, 8, 1]
    assert propose(one_token, 1) == [7]
    assert propose(one_token, 1, max_ngram=3, min_ngram=3) == []
    copying = [5, 1, 7, 8, 2, 1, 7, 8]
    assert propose(copying, 1, max_ngram=3, min_ngram=3) == [2]
