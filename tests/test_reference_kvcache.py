"""CPU: the NumPy reference of KV-cache decoding (issue 20, step 1): paged caches through a block
table, the in-place append, the split-KV decode with its exact combine and the query heads
packed by KV head, the split heuristic, and the checks of cache_seqlens and block tables."""

import numpy as np
import pytest
from ref_helpers import assert_same_attention, attention_by_definition

from cuflash import reference as ref


def _rand(rng, *shape):
    return rng.standard_normal(shape)


def _paged(rng, k_cache, page):
    """The contiguous cache (batch, capacity, heads_k, d) as shuffled pages and a block table."""
    batch, cap = k_cache.shape[:2]
    per = cap // page
    order = rng.permutation(batch * per)                 # page order[b * per + p] holds
    pages = np.zeros((batch * per, page) + k_cache.shape[2:])  # logical block p of entry b
    for b in range(batch):
        for p in range(per):
            pages[order[b * per + p]] = k_cache[b, p * page:(p + 1) * page]
    return pages, order.reshape(batch, per).astype(np.int32)


def test_cache_rows_and_append_through_a_block_table():
    rng = np.random.default_rng(0)
    kc, vc = _rand(rng, 3, 32, 2, 4), _rand(rng, 3, 32, 2, 4)
    seqlens = np.array([5, 0, 29])
    k, v = _rand(rng, 3, 3, 2, 4), _rand(rng, 3, 3, 2, 4)
    kc2, vc2 = ref.kvcache_append(kc, vc, seqlens, k, v)
    for b in range(3):
        np.testing.assert_array_equal(kc2[b, seqlens[b]:seqlens[b] + 3], k[b])
        np.testing.assert_array_equal(kc2[b, :seqlens[b]], kc[b, :seqlens[b]])
    kp, table = _paged(rng, kc, 8)
    vp, _ = _paged(np.random.default_rng(0), vc, 8)  # (the same shuffle: same seed)
    for b, n in ((0, 17), (2, 32), (1, 0)):
        np.testing.assert_array_equal(ref.cache_rows(kp, b, n, table), kc[b, :n])
    kp2, _ = ref.kvcache_append(kp, vp, seqlens, k, v, table)
    for b in range(3):
        np.testing.assert_array_equal(ref.cache_rows(kp2, b, seqlens[b] + 3, table),
                                      kc2[b, :seqlens[b] + 3])


def test_kvcache_naive_is_attention_over_each_entrys_keys():
    """Decoding with append (seqlen_q 2, causal bottom-right) against each entry's attention by
    definition over its cached keys followed by the new ones."""
    rng = np.random.default_rng(1)
    batch, cap, h, hk, d = 3, 40, 4, 2, 8
    kc, vc = _rand(rng, batch, cap, hk, d), _rand(rng, batch, cap, hk, d)
    q, k, v = _rand(rng, batch, 2, h, d), _rand(rng, batch, 2, hk, d), _rand(rng, batch, 2, hk, d)
    seqlens = np.array([7, 0, 38])
    O, L = ref.attention_kvcache_naive(q, kc, vc, seqlens, k=k, v=v, causal=True)
    for b in range(batch):
        n = seqlens[b]
        K = np.concatenate([kc[b, :n], k[b]])[None]
        V = np.concatenate([vc[b, :n], v[b]])[None]
        O_b, L_b = attention_by_definition(q[b:b + 1], K, V, d ** -0.5, causal=True)
        assert_same_attention(O[b:b + 1], L[b:b + 1], O_b, L_b, 1e-12)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("G, seqlen_q, causal, features", [
    (1, 1, False, {}),
    (4, 1, True, {}),
    (8, 1, False, {"softcap": 3.0}),
    (4, 3, True, {"window_size": (5, 0)}),
    (2, 2, False, {"alibi": True}),
    (4, 3, True, {"softcap": 2.0, "alibi": True, "window_size": (9, -1)}),
])
def test_split_kv_equals_naive(paged, G, seqlen_q, causal, features):
    """Every split count (one, a few, more splits than column blocks: empty splits) gives the
    naive decode's O and L, with GQA packing, append, masks and the hook; cache lengths from
    zero keys to the full capacity, contiguous and paged."""
    rng = np.random.default_rng(2)
    batch, cap, hk, d, page = 4, 96, 2, 8, 16
    h = G * hk
    kc, vc = _rand(rng, batch, cap, hk, d), _rand(rng, batch, cap, hk, d)
    table = None
    if paged:  # (the same shuffle of pages for K and V: the same seed)
        kc, table = _paged(np.random.default_rng(7), kc, page)
        vc, _ = _paged(np.random.default_rng(7), vc, page)
    q = _rand(rng, batch, seqlen_q, h, d) * 2
    k, v = _rand(rng, batch, 2, hk, d), _rand(rng, batch, 2, hk, d)
    seqlens = np.array([0, 1, 45, cap - 2])
    kw = {key: val for key, val in features.items() if key != "alibi"}
    if features.get("alibi"):
        kw["alibi_slopes"] = rng.uniform(0.05, 0.5, (batch, h))
    O, L = ref.attention_kvcache_naive(q, kc, vc, seqlens, k=k, v=v, block_table=table,
                                       causal=causal, **kw)
    assert np.isfinite(L).any()
    for splits in (1, 3, 7, 40):
        O_s, L_s = ref.attention_kvcache_split(q, kc, vc, seqlens, num_splits=splits, B_c=16,
                                               k=k, v=v, block_table=table, causal=causal, **kw)
        assert_same_attention(O_s, L_s, O, L, 1e-12)


def test_kvcache_splits_cover_the_key_range_in_order():
    for n, B_c, s in ((0, 64, 4), (1, 64, 4), (1000, 64, 1), (1000, 64, 3), (1000, 64, 40)):
        ranges = ref.kvcache_splits(n, B_c, s)
        assert len(ranges) == s
        covered = [j for begin, end in ranges for j in range(begin, end)]
        assert covered == list(range(-(-n // B_c)))


def test_num_splits_fills_half_the_gpu():
    # a full grid already (80% of half the slots): one split
    assert ref.num_splits_for(64, 8, 1, 32768, 132, 64) == 1
    assert ref.num_splits_for(8, 8, 1, 32768, 132, 64) == 1
    # decode at batch 1 on 8 KV heads over 32k keys: splits until the blocks fill half of
    # 132 slots, not all of them
    s = ref.num_splits_for(1, 8, 1, 32768, 132, 64)
    assert 8 * s >= 0.8 * 66 and 8 * s <= 66
    # each warp streams at least 2 column blocks of its split
    for nwarps in (4, 8):
        for T_c in (8, 64, 256, 1024):
            s = ref.num_splits_for(1, 1, 1, T_c * 64, 132, 64, nwarps)
            assert s == 1 or T_c // s >= 2 * nwarps
    assert ref.num_splits_for(1, 1, 1, 8 * 64, 132, 64, 8) == 1
    assert ref.num_splits_for(1, 1, 1, 64 * 64, 132, 64, 8) == 4
    assert ref.num_splits_for(1, 1, 1, 64 * 64, 132, 64, 4) == 8
    # a paged cache aims at all the slots where its blocks would be long (over 2048 keys each
    # on half the slots), and at half where they would be short
    s_paged = ref.num_splits_for(1, 8, 1, 131072, 132, 64, paged=True)
    assert 8 * s_paged >= 0.8 * 132 and s_paged > ref.num_splits_for(1, 8, 1, 131072, 132, 64)
    assert ref.num_splits_for(8, 8, 1, 32768, 132, 64, paged=True) > 1
    for n in (1024, 8192):
        assert ref.num_splits_for(1, 8, 1, n, 132, 16, 8, paged=True) == \
            ref.num_splits_for(1, 8, 1, n, 132, 16, 8)


@pytest.mark.parametrize("seqlens, table, msg", [
    ([3, 31], None, "capacity"),
    ([-1, 0], None, "capacity"),
    ([1, 2, 3], None, "integers"),
    ([3, 20], [[0, 1], [2, 9]], "pages outside"),
])
def test_cache_seqlens_and_block_tables_are_checked(seqlens, table, msg):
    k_cache = np.zeros((4, 16, 1, 8)) if table is not None else np.zeros((2, 32, 1, 8))
    with pytest.raises(ValueError, match=msg):
        ref.check_kvcache(k_cache, np.array(seqlens), 2, 2,
                          None if table is None else np.array(table))
