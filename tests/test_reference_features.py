"""CPU: the NumPy reference of the training features (issue 19, step 1): sliding windows,
softcap, ALiBi and variable-length batches. The naive attention against a per-row definition
and finite differences; the tiled FA2 simulations (the kernels' block ranges and element
masks) against the naive attention; the block ranges against the mask."""


import numpy as np
import pytest
from ref_helpers import (
    assert_same_attention,
    assert_vjp_matches_finite_differences,
    attention_by_definition,
)

from cuflash import reference as ref


def _rand(rng, *shape):
    return rng.standard_normal(shape)


WINDOWS = [(-1, -1), (0, 0), (3, -1), (-1, 2), (4, 1), (7, 0), (0, 5), (40, 40)]


# ---- the mask's key ranges and block ranges ----------------------------------------------

def test_window_key_ranges():
    m = ref.Mask(6, 10, window_left=2, window_right=1)   # the diagonal of row i is key i + 4
    assert m.keys(0) == (2, 5) and m.keys(5) == (7, 9)
    assert m.LOCAL and m.right == 1
    assert ref.Mask(6, 10, True, 2, 3).right == 0          # causal is right = 0
    assert ref.Mask(6, 10, True, 2, -1).keys(0) == (2, 4)
    assert not ref.Mask(6, 10, True).LOCAL
    m = ref.Mask(4, 2, window_left=0, window_right=0)       # diagonal -2 .. 1: rows 0, 1 see
    assert [m.keys(i)[0] <= m.keys(i)[1] for i in range(4)] == [False, False, True, True]
    # the rows that see a key range, for the backward (first_row, last_row)
    m = ref.Mask(50, 60, window_left=5, window_right=3)
    vis = m.visible()
    for lo, hi in ((0, 9), (20, 29), (55, 59)):
        rows = np.nonzero(vis[:, lo:hi + 1].any(axis=1))[0]
        assert m.first_row(lo) <= rows.min() and rows.max() <= m.last_row(hi)
        assert m.first_row(lo) == max(0, lo - 10 - 3) and m.last_row(hi) == min(49, hi - 10 + 5)


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("sq,sk,B_r,B_c", [(37, 61, 8, 16), (61, 37, 16, 8), (64, 64, 16, 16),
                                           (5, 300, 4, 32)])
def test_window_block_ranges_match_the_mask(window, sq, sk, B_r, B_c):
    """column_blocks (forward) and row_blocks / block_needs_mask (backward): every visible
    key's block is visited, skipped blocks are fully hidden, unmasked blocks fully visible."""
    for causal in (False, True):
        mask = ref.Mask(sq, sk, causal, *window)
        vis = mask.visible()
        for i in range(-(-sq // B_r)):
            cb = ref.column_blocks(mask, i, B_r, B_c)
            for j in range(-(-sk // B_c)):
                blk = vis[i * B_r:(i + 1) * B_r, j * B_c:(j + 1) * B_c]
                if not cb.begin <= j < cb.end:
                    assert not blk.any()
                elif cb.unmasked_begin <= j < cb.masked_begin:
                    assert blk.all()
        for j in range(-(-sk // B_c)):
            begin, end = ref.row_blocks(mask, j, B_r, B_c)
            for i in range(-(-sq // B_r)):
                blk = vis[i * B_r:(i + 1) * B_r, j * B_c:(j + 1) * B_c]
                if not begin <= i < end:
                    assert not blk.any()
                elif not ref.block_needs_mask(mask, i, j, B_r, B_c):
                    assert blk.all()


def test_window_bench_counts_visible_pairs():
    """bench/window_bench.py's ideal: the visible pairs of a causal window, against the mask."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import window_bench
    for n, left in ((5, 1), (37, 0), (64, 9), (10, -1)):
        assert window_bench.visible_pairs(n, left) == ref.Mask(n, n, True, left).visible().sum()


def test_window_skips_blocks():
    """A window of 256 over 16k keys: each row block visits the blocks its window touches,
    not all of them (block skipping really skips)."""
    n, B_r, B_c, left = 16384, 128, 128, 256
    mask = ref.Mask(n, n, True, left, 0)
    visited = sum(cb.end - cb.begin for cb in (ref.column_blocks(mask, i, B_r, B_c)
                                                 for i in range(n // B_r)))
    assert visited <= (n // B_r) * ((left + B_r) // B_c + 1)
    # the backward: each column block's row blocks
    rows = sum(e - b for b, e in (ref.row_blocks(mask, j, B_r, B_c) for j in range(n // B_c)))
    assert rows <= (n // B_c) * ((left + B_c) // B_r + 1)


# ---- the forward -------------------------------------------------------------------------

@pytest.mark.parametrize("features", [
    dict(window=(3, 1)), dict(window=(0, 0)), dict(window=(2, -1), causal=True),
    dict(softcap=2.0), dict(softcap=0.5, causal=True),
    dict(slopes="h"), dict(slopes="bh", causal=True),
    dict(window=(4, 2), softcap=1.5, slopes="h"),
], ids=lambda f: "_".join(f"{k}{v}" for k, v in f.items()))
@pytest.mark.parametrize("sq,sk,h,hk", [(5, 9, 2, 1), (9, 5, 4, 2), (1, 1, 1, 1)])
def test_naive_matchesattention_by_definition(sq, sk, h, hk, features):
    rng = np.random.default_rng(sq * 10 + sk)
    q, k, v = _rand(rng, 2, sq, h, 8), _rand(rng, 2, sk, hk, 8), _rand(rng, 2, sk, hk, 8)
    slopes = {None: None, "h": rng.uniform(0.1, 1, h),
              "bh": rng.uniform(0.1, 1, (2, h))}[features.get("slopes")]
    kw = dict(window_size=features.get("window", (-1, -1)), softcap=features.get("softcap", 0),
              alibi_slopes=slopes)
    causal = features.get("causal", False)
    O, L = ref.attention_naive(q, k, v, causal, 0.6, **kw)
    O2, L2 = attention_by_definition(q, k, v, 0.6, kw["window_size"], causal, kw["softcap"], slopes)
    assert_same_attention(O, L, O2, L2, 1e-12)


CASES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_k, d, B_r, B_c)
    (2, 17, 33, 4, 2, 16, 8, 16),
    (1, 33, 17, 3, 1, 8, 16, 8),
    (1, 113, 113, 2, 2, 16, 32, 16),
    (1, 3, 203, 1, 1, 24, 16, 16),
]


def _case(case, seed):
    b, sq, sk, h, hk, d = case[:6]
    rng = np.random.default_rng(sum(case) + seed)
    return (_rand(rng, b, sq, h, d), _rand(rng, b, sk, hk, d), _rand(rng, b, sk, hk, d),
            _rand(rng, b, sq, h, d), rng.uniform(0.05, 0.5, (b, h)))


@pytest.mark.parametrize("softcap,alibi", [(0.0, False), (3.0, False), (0.0, True),
                                           (2.0, True)], ids=["plain", "softcap", "alibi",
                                                              "both"])
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}_q{}_k{}_h{}_hk{}_d{}_Br{}_Bc{}"
                         .format(*c))
def test_tiled_forward_and_backward_equal_naive(case, window, softcap, alibi):
    """The FA2 forward loop (column_blocks' three phases, the element mask only on masked
    blocks, the score hook per block) and the backward loop (row_blocks, block_needs_mask,
    the hook's gradient per block) equal the naive attention, causal and not."""
    B_r, B_c = case[6:]
    q, k, v, dout, slopes = _case(case, 3)
    for causal in (False, True):
        kw = dict(window_size=window, softcap=softcap, alibi_slopes=slopes if alibi else None)
        O, L = ref.attention_naive(q, k, v, causal, **kw)
        O2, L2 = ref.attention_fa2_tiled(q, k, v, causal, B_r=B_r, B_c=B_c, **kw)
        assert_same_attention(O, L, O2, L2, 1e-12)
        O3, L3 = ref.attention_fa2_tiled(q, k, v, causal, B_r=B_r, B_c=B_c, rescale_log2=8,
                                         **kw)
        assert_same_attention(O, L, O3, L3, 1e-12)
        naive = ref.attention_backward_naive(dout, q, k, v, causal, **kw)
        tiled = ref.attention_backward_fa2_tiled(dout, q, k, v, O, L, causal, B_r=B_r, B_c=B_c,
                                                 **kw)
        for a, t in zip(naive, tiled):
            assert np.isfinite(t).all()
            np.testing.assert_allclose(t, a, rtol=0, atol=1e-11)


def test_alibi_split_keeps_the_row_max_in_true_units():
    """Under the causal mask the tiled forward takes ALiBi in two parts, as the kernels do
    (score.cuh: slope (j - j0) in S, the row's -slope (i + s_k - s_q - j0) added to the row
    max and to the exponent). With steep slopes the row's part is hundreds of units: a max
    taken without it would put P~ near the diagonal at e^-1000 = 0 (O = 0)."""
    rng = np.random.default_rng(7)
    q, k, v = (_rand(rng, 1, 300, 2, 8) for _ in range(3))
    slopes = np.array([16.0, 9.0])
    O, L = ref.attention_naive(q, k, v, True, alibi_slopes=slopes)
    for rescale in (None, 8):
        O2, L2 = ref.attention_fa2_tiled(q, k, v, True, B_r=32, B_c=64, rescale_log2=rescale,
                                         alibi_slopes=slopes)
        assert_same_attention(O, L, O2, L2, 1e-12)


def test_alibi_splits_on_both_sides_of_the_diagonal():
    """Without the causal mask the forward splits ALiBi wherever a block lies on one side of
    every row's diagonal: left (+slope (j - j0), row part -slope (i + s_k - s_q - j0)), right
    (both negated); blocks crossing it take the whole term. Each of the three occurs here,
    S' + row_bias is the hooked S on every block, and with steep slopes the tiled forward
    still equals the naive one."""
    rng = np.random.default_rng(11)
    q, k, v = (_rand(rng, 1, 300, 2, 8) for _ in range(3))
    slopes = np.array([16.0, 0.5])
    score = ref.Score(0.3, 2.0, slopes)
    sides = set()
    for j0 in range(0, 300, 64):
        rows, cols = np.arange(96, 128), np.arange(j0, min(j0 + 64, 300))
        S_raw = _rand(rng, 1, 2, len(rows), len(cols))
        S2, row_bias = score.apply_split(np, S_raw, rows, cols, 300, 300, False)
        np.testing.assert_allclose(S2 + row_bias, score.apply(np, S_raw, rows, cols, 300, 300),
                                   rtol=1e-12, atol=1e-9)
        dist = rows[:, None] - cols[None, :]
        side = "left" if (dist >= 0).all() else "right" if (dist <= 0).all() else "cross"
        sides.add(side)
        assert np.all(np.asarray(row_bias) == 0) == (side == "cross")
    assert sides == {"left", "right", "cross"}
    O, L = ref.attention_naive(q, k, v, False, alibi_slopes=slopes)
    for rescale in (None, 8):
        O2, L2 = ref.attention_fa2_tiled(q, k, v, False, B_r=32, B_c=64, rescale_log2=rescale,
                                         alibi_slopes=slopes)
        assert_same_attention(O, L, O2, L2, 1e-12)


# ---- the backward ------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(softcap=1.5), dict(alibi_slopes=[0.3, 0.7]),
                                dict(window_size=(2, 1), softcap=0.8,
                                     alibi_slopes=[[0.2, 0.5]])],
                         ids=["softcap", "alibi", "window_softcap_alibi"])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_backward_matches_finite_differences(kw, causal):
    """The gradients through the score hook (softcap's 1 - tanh^2; ALiBi's bias has none)."""
    rng = np.random.default_rng(11)
    q, k, v = _rand(rng, 1, 4, 2, 4), _rand(rng, 1, 5, 1, 4), _rand(rng, 1, 5, 1, 4)
    dout = _rand(rng, 1, 4, 2, 4)
    grads = ref.attention_backward_naive(dout, q, k, v, causal, 0.9, **kw)

    assert_vjp_matches_finite_differences(
        lambda q_, k_, v_: ref.attention_naive(q_, k_, v_, causal, 0.9, **kw)[0],
        q, k, v, dout, grads)


def test_same_dtype_references_take_the_features():
    """The yardsticks of the accuracy rule, with the features: close to float64 (bf16 error),
    not equal."""
    import ml_dtypes
    rng = np.random.default_rng(5)
    q, k, v, dout, slopes = _case((1, 40, 50, 2, 1, 32, 0, 0), 0)
    kw = dict(window_size=(9, 3), softcap=2.0, alibi_slopes=slopes)
    bf = [x.astype(ml_dtypes.bfloat16) for x in (q, k, v, dout)]
    O, _ = ref.attention_naive(*bf[:3], True, **kw)
    O16 = ref.attention_naive_same_dtype(*bf[:3], True, **kw).astype(np.float64)
    assert 0 < np.abs(O16 - O).max() < 0.05
    g = ref.attention_backward_naive(bf[3], *bf[:3], True, **kw)
    g16 = ref.attention_backward_naive_same_dtype(bf[3], *bf[:3], True, **kw)
    for a, b in zip(g, g16):
        assert 0 < np.abs(b.astype(np.float64) - a).max() < 0.1 * max(1.0, np.abs(a).max())
    assert rng is not None


# ---- variable length ---------------------------------------------------------------------

def test_varlen_equals_each_sequence_alone():
    """Packed sequences (one of them empty, one with no keys) attend within themselves, each
    mask aligned on its own lengths; ALiBi slopes per batch entry."""
    rng = np.random.default_rng(9)
    lq, lk = [5, 0, 7, 3, 4], [6, 3, 7, 0, 9]
    cq, ck = np.cumsum([0] + lq), np.cumsum([0] + lk)
    h, hk, d = 4, 2, 8
    q, k, v = _rand(rng, cq[-1], h, d), _rand(rng, ck[-1], hk, d), _rand(rng, ck[-1], hk, d)
    dout = _rand(rng, cq[-1], h, d)
    slopes = rng.uniform(0.1, 0.5, (len(lq), h))
    kw = dict(window_size=(3, -1), softcap=1.0, alibi_slopes=slopes)
    O, L = ref.attention_naive_varlen(q, k, v, cq, ck, True, **kw)
    dq, dk, dv = ref.attention_backward_naive_varlen(dout, q, k, v, cq, ck, True, **kw)
    assert O.shape == q.shape and L.shape == (h, cq[-1])
    for b in range(len(lq)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        kw_b = dict(kw, alibi_slopes=slopes[b])
        O_b, L_b = ref.attention_naive(q[None, qs], k[None, ks], v[None, ks], True, **kw_b)
        np.testing.assert_array_equal(O[qs], O_b[0])
        np.testing.assert_array_equal(L[:, qs], L_b[0])
        g = ref.attention_backward_naive(dout[None, qs], q[None, qs], k[None, ks], v[None, ks],
                                         True, **kw_b)
        np.testing.assert_array_equal(dq[qs], g[0][0])
        np.testing.assert_array_equal(dk[ks], g[1][0])
    # the sequence with no keys: O = 0, L = -inf
    assert (O[cq[3]:cq[4]] == 0).all() and np.isneginf(L[:, cq[3]:cq[4]]).all()


@pytest.mark.parametrize("cu,total,msg", [
    ([0, 3, 2, 5], 5, "never decrease"), ([1, 5], 5, "start at 0"), ([0, 4], 5, "end at 5"),
    ([0], 0, "length batch"), ([[0, 1]], 1, "1-D"), ([0.0, 1.0], 1, "integer")])
def test_cu_seqlens_are_checked(cu, total, msg):
    with pytest.raises(ValueError, match=msg):
        ref.check_cu_seqlens(cu, total)
    assert ref.check_cu_seqlens(np.array([0, 0, 3], np.int32), 3).dtype == np.int64


# ---- variable-length batches: the kernels' packed addressing ----------------------------------

def test_packed_seq_info_offsets():
    """PackedSeq::info mirrored: entry b's rows start at cu_seqlens[b] (times the row stride),
    its L at head * total_q + start; dense entries as before."""
    cu_q, cu_k = [0, 5, 5, 12], [0, 3, 10, 10]
    s = ref.packed_seq_info(2, cu_q, cu_k, 12)
    assert (s.seqlen_q, s.seqlen_k, s.packed) == (7, 0, True)
    assert s.q_offset(999, 32) == 5 * 32 and s.k_offset(999, 16) == 10 * 16
    assert s.row_vector(3, 4) == 3 * 12 + 5
    d = ref.seq_info(2, 7, 9)
    assert not d.packed and d.q_offset(100, 32) == 200 and d.row_vector(3, 4) == (2 * 4 + 3) * 7


@pytest.mark.parametrize("kw", [{}, dict(window_size=(3, 0), softcap=2.0,
                                         alibi_slopes=[[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])],
                         ids=["plain", "features"])
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_varlen_equals_naive_varlen(kw, causal):
    """The packed forward as the kernels walk it (grid over the longest sequence's row blocks,
    the blocks past an entry's end skipped, rows found through the packed offsets) equals the
    naive varlen attention, zero-length sequences and keyless ones included."""
    rng = np.random.default_rng(5)
    lens_q, lens_k = [9, 0, 4], [6, 3, 0]
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0],
                                                                           np.cumsum(lens_k)])
    q = rng.standard_normal((13, 2, 8))
    k, v = rng.standard_normal((9, 1, 8)), rng.standard_normal((9, 1, 8))
    O, L, worked = ref.attention_fa2_tiled_varlen(q, k, v, cu_q, cu_k, 9, causal, B_r=4,
                                                  B_c=4, **kw)
    O_n, L_n = ref.attention_naive_varlen(q, k, v, cu_q, cu_k, causal, **kw)
    np.testing.assert_allclose(O, O_n, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(L), np.isneginf(L_n))
    fin = np.isfinite(L_n)
    np.testing.assert_allclose(L[fin], L_n[fin], rtol=0, atol=1e-12)
    assert worked == 3 + 0 + 1  # of 3 row blocks per entry: 9 rows, none, 4 rows


def test_packed_units_number_every_row_block_once():
    """PackedUnits (the Hopper forward's tile numbering over a packed batch): units taken in
    increasing order, with the gaps a scheduler's blocks leave between the units each draws,
    cover every (entry, head, row block) of every non-empty entry exactly once, and nothing
    past the last one; zero-length entries have none."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        lens = [int(n) for n in rng.integers(0, 700, rng.integers(1, 30))]
        cu = np.concatenate([[0], np.cumsum(lens)])
        nheads, B_r = int(rng.integers(1, 5)), int(rng.choice([64, 128, 192]))
        expected = {(b, h, r) for b, n in enumerate(lens) for h in range(nheads)
                    for r in range(-(-n // B_r))}
        # several blocks drawing from one counter: each walks its own increasing units
        blocks = int(rng.integers(1, 9))
        got = []
        for x in range(blocks):
            walk = ref.PackedUnits(cu, nheads, B_r)
            for u in range(x, len(expected) + blocks, blocks):
                tile = walk.find(u)
                if tile is None:
                    assert u >= len(expected)
                    break
                got.append(tile)
        assert len(got) == len(set(got)) and set(got) == expected
