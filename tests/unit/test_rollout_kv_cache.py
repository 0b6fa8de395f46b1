"""The radix prefix KV cache on synthetic K/V whose values are their token ids: every hit can be checked
against the exact positions it should have come from."""

import torch

from temper.rollout.kv_cache import PrefixKVCache

LAYERS, HEADS, DIM = 2, 1, 2


def kv_for(tokens):
    """K/V that encode the token at each position (K = token, V = -token), per layer."""
    t = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1).expand(1, HEADS, -1, DIM).contiguous()
    return [(t + layer, -t - layer) for layer in range(LAYERS)]


def bytes_for(n_tokens):
    return LAYERS * 2 * HEADS * DIM * 4 * n_tokens


def assert_kv_is(kv, tokens):
    expected = kv_for(tokens)
    for (k, v), (ek, ev) in zip(kv, expected, strict=True):
        assert torch.equal(k, ek) and torch.equal(v, ev)


def test_match_returns_the_longest_prefix_and_its_exact_kv():
    c = PrefixKVCache(budget_bytes=10**6)
    assert c.match([1, 2, 3]).length == 0
    c.insert([1, 2, 3, 4, 5], kv_for([1, 2, 3, 4, 5]))
    hit = c.match([1, 2, 3, 9])
    assert hit.length == 3
    assert_kv_is(hit.kv, [1, 2, 3])
    assert c.match([1, 2, 3, 4, 5, 6], max_length=4).length == 4


def test_divergent_insert_splits_the_edge_and_shares_the_prefix():
    c = PrefixKVCache(budget_bytes=10**6)
    c.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]))
    added = c.insert([1, 2, 7, 8, 9], kv_for([1, 2, 7, 8, 9]))
    assert added == 3  # only the new suffix is copied
    assert c.nbytes == bytes_for(4 + 3)
    assert sorted(c.cached_sequences()) == [(1, 2, 3, 4), (1, 2, 7, 8, 9)]
    assert_kv_is(c.match([1, 2, 7, 8, 9]).kv, [1, 2, 7, 8, 9])
    assert_kv_is(c.match([1, 2, 3, 4, 0]).kv, [1, 2, 3, 4])
    assert c.insert([1, 2, 3], kv_for([1, 2, 3])) == 0  # already inside an edge


def test_lru_evicts_leaves_first_and_never_exceeds_the_budget():
    system = [100, 101, 102, 103]
    c = PrefixKVCache(budget_bytes=bytes_for(4 + 3 + 3))  # system prompt + two 3-token branches
    c.insert(system + [1, 1, 1], kv_for(system + [1, 1, 1]))
    c.insert(system + [2, 2, 2], kv_for(system + [2, 2, 2]))
    c.match(system + [1, 1, 1])  # branch 1 is now the most recent
    c.insert(system + [3, 3, 3], kv_for(system + [3, 3, 3]))
    assert c.nbytes <= c.budget_bytes
    seqs = sorted(c.cached_sequences())
    assert seqs == [tuple(system + [1, 1, 1]), tuple(system + [3, 3, 3])]  # branch 2 (LRU leaf) went
    assert c.evictions == 1 and c.evicted_tokens == 3
    hit = c.match(system + [2, 2, 2])
    assert hit.length == 4  # the shared system prompt survived its evicted child
    assert_kv_is(hit.kv, system)


def test_an_entry_larger_than_the_budget_is_not_kept():
    c = PrefixKVCache(budget_bytes=bytes_for(3))
    c.insert([1, 2, 3, 4, 5], kv_for([1, 2, 3, 4, 5]))
    assert c.nbytes == 0 and c.cached_sequences() == [] and c.match([1, 2]).length == 0


def test_eviction_of_a_whole_chain_frees_parents_too():
    c = PrefixKVCache(budget_bytes=bytes_for(6))
    c.insert([1, 2, 3], kv_for([1, 2, 3]))
    c.insert([1, 2, 3, 4, 5, 6], kv_for([1, 2, 3, 4, 5, 6]))
    c.insert([9, 9, 9, 9, 9], kv_for([9, 9, 9, 9, 9]))  # needs room: the older chain goes, leaf then parent
    assert c.cached_sequences() == [(9, 9, 9, 9, 9)] and c.nbytes == bytes_for(5)
