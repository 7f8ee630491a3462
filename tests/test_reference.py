"""CPU: the NumPy reference. The naive attention is checked against a direct per-row
definition; the tiled FA2 simulation (the kernel's exact loop) against the naive one."""

import itertools

import numpy as np
import pytest
from ref_helpers import (
    assert_same_attention,
    assert_vjp_matches_finite_differences,
    attention_by_definition,
)

from cuflash import _plan
from cuflash import reference as ref


def _rand(rng, *shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,h,hk", [(5, 5, 2, 2), (7, 3, 4, 2), (3, 9, 3, 1), (1, 1, 1, 1)])
def test_naive_matches_definition(sq, sk, h, hk, causal):
    rng = np.random.default_rng(sq * 100 + sk)
    q, k, v = _rand(rng, 2, sq, h, 8), _rand(rng, 2, sk, hk, 8), _rand(rng, 2, sk, hk, 8)
    O, L = ref.attention_naive(q, k, v, causal, softmax_scale=0.7)
    O2, L2 = attention_by_definition(q, k, v, 0.7, causal=causal)
    assert_same_attention(O, L, O2, L2, 1e-12)


CASES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_k, d, B_r, B_c)
    (2, 17, 33, 4, 2, 16, 8, 16),
    (1, 33, 17, 3, 1, 8, 16, 8),     # seqlen_q > seqlen_k: causal rows with no key
    (2, 5, 5, 2, 2, 8, 4, 4),
    (1, 1, 1, 1, 1, 8, 64, 64),
    (1, 3, 203, 1, 1, 24, 16, 16),
    (1, 113, 113, 2, 2, 16, 32, 16),
    (1, 203, 1025, 1, 1, 8, 64, 128),
    (1, 1023, 1023, 1, 1, 8, 128, 64),
    (2, 70, 70, 2, 1, 24, 16, 32),
    (1, 64, 64, 1, 1, 8, 16, 16),    # multiples of the tiles
]


def case_id(c):
    return "b{}_q{}_k{}_h{}_hk{}_d{}_Br{}_Bc{}".format(*c)


def case_inputs(case, seed_offset, with_dout=False):
    """Fresh q, k, v (and dout) for a (batch, seqlen_q, seqlen_k, heads, heads_k, d, ...) case."""
    b, sq, sk, h, hk, d = case[:6]
    rng = np.random.default_rng(sum(case) + seed_offset)
    arrays = [_rand(rng, b, sq, h, d), _rand(rng, b, sk, hk, d), _rand(rng, b, sk, hk, d)]
    if with_dout:
        arrays.append(_rand(rng, b, sq, h, d))
    return arrays


@pytest.mark.parametrize("tiled", [ref.attention_fa2_tiled, ref.attention_fa1_tiled],
                         ids=["fa2", "fa1"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_tiled_forward_equals_naive(case, causal, tiled):
    """FA2's loop (row blocks outside) and FA1's (column blocks outside) both equal naive."""
    B_r, B_c = case[6:]
    q, k, v = case_inputs(case, 0)
    O, L = ref.attention_naive(q, k, v, causal)
    O2, L2 = tiled(q, k, v, causal, B_r=B_r, B_c=B_c)
    assert_same_attention(O, L, O2, L2, 1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile", sorted({cfgs[0] for key, cfgs in _plan.TILES.items()
                                         if key[0] == "sm90a"},
                                        key=lambda t: (t.HD, t.B_c)),
                         ids=lambda t: f"HD{t.HD}_Bc{t.B_c}")
def test_hopper_tiles_visit_the_right_blocks(tile, causal):
    """The Hopper forward's tiles (B_r = 128, its B_c) through the kernels' block ranges
    (three phases, the element mask only on masked blocks): equal to naive attention for
    seqlen_q below, equal to and above seqlen_k, lengths that are not tile multiples."""
    for sq, sk in ((129, 300), (300, 129), (257, 257), (1, 97)):
        q, k, v = case_inputs((1, sq, sk, 2, 1, 8), tile.B_c)
        O, L = ref.attention_naive(q, k, v, causal)
        O2, L2 = ref.attention_fa2_tiled(q, k, v, causal, B_r=tile.B_r, B_c=tile.B_c)
        assert_same_attention(O, L, O2, L2, 1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("growth", [0.0, 3.0], ids=["flat", "rising"])
def test_lazy_rescaling_equals_naive(growth, causal):
    """The kernel's lazy rescaling (m_i kept until P~ would pass 2^8): same O and L. "rising"
    scales the keys up block by block, so row maxima pass m_i by more than 2^8 at some blocks
    (m_i moves) and by less at others (m_i stays); "flat" keeps the first block's m_i."""
    rng = np.random.default_rng(7)
    q, k, v = _rand(rng, 2, 40, 2, 16), _rand(rng, 2, 48, 2, 16), _rand(rng, 2, 48, 2, 16)
    k = k * (1.0 + growth * (np.arange(48) // 8))[None, :, None, None]
    O, L = ref.attention_naive(q, k, v, causal)
    for t in (0.0, 8.0):
        O2, L2 = ref.attention_fa2_tiled(q, k, v, causal, B_r=16, B_c=8, rescale_log2=t)
        assert_same_attention(O, L, O2, L2, 1e-12)


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    rng = np.random.default_rng(1)
    q, k, v = _rand(rng, 1, 10, 1, 8), _rand(rng, 1, 4, 1, 8), _rand(rng, 1, 4, 1, 8)
    for O, L in (ref.attention_naive(q, k, v, True),
                 ref.attention_fa2_tiled(q, k, v, True, B_r=4, B_c=2)):
        # bottom-right alignment: row i sees keys j <= i - 6, so rows 0..5 see nothing
        assert (O[0, :6] == 0).all() and np.isneginf(L[0, 0, :6]).all()
        assert np.isfinite(L[0, 0, 6:]).all() and (np.abs(O[0, 6:]) > 0).any()


def test_empty_keys():
    q = np.ones((1, 3, 1, 8))
    k = v = np.zeros((1, 0, 1, 8))
    O, L = ref.attention_naive(q, k, v)
    assert (O == 0).all() and np.isneginf(L).all()


@pytest.mark.parametrize("causal", [False, True])
def test_column_blocks_match_mask(causal):
    """Exhaustively: skipped blocks have no visible key, unmasked blocks are fully visible,
    and the visited range is tight (first and last visited blocks hold a visible key or a
    needed mask)."""
    for B_r, B_c in [(16, 16), (16, 32), (64, 16), (128, 64)]:
        for sq, sk in itertools.product([1, 3, 17, 64, 65, 130], [1, 5, 16, 64, 100, 129]):
            mask = ref.Mask(sq, sk, causal)
            visible = mask.visible()
            for i in range(-(-sq // B_r)):
                cb = ref.column_blocks(mask, i, B_r, B_c)
                assert cb.begin <= cb.unmasked_begin <= cb.masked_begin <= cb.end
                rows = slice(i * B_r, min((i + 1) * B_r, sq))
                for j in range(-(-sk // B_c)):
                    blk = visible[rows, j * B_c:(j + 1) * B_c]
                    full = blk.shape[1] == B_c and blk.all()
                    if j < cb.begin or j >= cb.end:
                        assert not blk.any()
                    elif cb.unmasked_begin <= j < cb.masked_begin:
                        assert full
                    else:
                        assert not full  # a block that needs no mask is never masked
                if cb.end > cb.begin:
                    assert visible[rows, (cb.end - 1) * B_c:cb.end * B_c].any()


@pytest.mark.parametrize("causal", [False, True])
def test_row_blocks_and_block_masks_match_mask(causal):
    """The backward's ranges: row blocks outside [begin, end) see no key of column block j,
    and block_needs_mask is false only where every row sees every key."""
    for B_r, B_c in [(16, 16), (64, 128), (128, 64)]:
        for sq, sk in itertools.product([1, 3, 17, 64, 65, 130], [1, 5, 16, 64, 100, 129]):
            mask = ref.Mask(sq, sk, causal)
            visible = mask.visible()
            for j in range(-(-sk // B_c)):
                begin, end = ref.row_blocks(mask, j, B_r, B_c)
                for i in range(-(-sq // B_r)):
                    blk = visible[i * B_r:(i + 1) * B_r, j * B_c:(j + 1) * B_c]
                    if not begin <= i < end:
                        assert not blk.any()
                    elif not ref.block_needs_mask(mask, i, j, B_r, B_c):
                        assert blk.all() and blk.shape[1] == B_c


def test_mask_key_ranges_and_seq_info():
    mask = ref.Mask(5, 3, causal=True)  # rows 0, 1 see nothing
    assert [mask.keys(r) for r in range(5)] == [(0, -2), (0, -1), (0, 0), (0, 1), (0, 2)]
    assert mask.first_row(0) == 2 and mask.first_row(2) == 4 and mask.last_row(2) == 4
    assert ref.Mask(3, 5).keys(0) == (0, 4)
    si = ref.seq_info(3, 100, 200)
    assert (si.q_offset(7000, 70), si.k_offset(9000, 90), si.row_vector(2, 4)) == \
        (21000, 27000, 1400)


# ---- backward ------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,h,hk", [(4, 5, 2, 1), (5, 3, 2, 2)])
def test_naive_backward_matches_finite_differences(sq, sk, h, hk, causal):
    rng = np.random.default_rng(7 + sq + sk)
    q, k, v = _rand(rng, 1, sq, h, 4), _rand(rng, 1, sk, hk, 4), _rand(rng, 1, sk, hk, 4)
    dout = _rand(rng, 1, sq, h, 4)
    grads = ref.attention_backward_naive(dout, q, k, v, causal, softmax_scale=0.8)

    assert_vjp_matches_finite_differences(
        lambda q_, k_, v_: ref.attention_naive(q_, k_, v_, causal, 0.8)[0], q, k, v, dout, grads)


BWD_CASES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_k, d, B_r, B_c)
    (2, 17, 33, 4, 2, 16, 8, 16),
    (1, 33, 17, 3, 1, 8, 16, 8),     # rows that see no key
    (1, 130, 70, 2, 1, 24, 64, 64),
    (1, 3, 203, 1, 1, 8, 64, 64),
    (1, 200, 200, 2, 2, 8, 64, 64),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", BWD_CASES, ids=case_id)
def test_fa2_tiled_backward_equals_naive(case, causal):
    B_r, B_c = case[6:]
    q, k, v, dout = case_inputs(case, 1, with_dout=True)
    O, L = ref.attention_naive(q, k, v, causal)
    naive = ref.attention_backward_naive(dout, q, k, v, causal)
    tiled = ref.attention_backward_fa2_tiled(dout, q, k, v, O, L, causal, B_r=B_r, B_c=B_c)
    for a, t in zip(naive, tiled):
        assert np.isfinite(t).all()
        np.testing.assert_allclose(t, a, rtol=0, atol=1e-12)


def test_fully_masked_rows_have_zero_gradients():
    rng = np.random.default_rng(3)
    q, k, v = _rand(rng, 1, 10, 1, 8), _rand(rng, 1, 4, 1, 8), _rand(rng, 1, 4, 1, 8)
    dout = _rand(rng, 1, 10, 1, 8)
    O, L = ref.attention_naive(q, k, v, True)
    for dq, dk, dv in (ref.attention_backward_naive(dout, q, k, v, True),
                       ref.attention_backward_fa2_tiled(dout, q, k, v, O, L, True, 4, 2)):
        assert (dq[0, :6] == 0).all() and np.isfinite(dk).all() and np.isfinite(dv).all()


def test_same_dtype_references_are_close_but_not_exact():
    import ml_dtypes
    rng = np.random.default_rng(5)
    for dt, lo, hi in ((np.float16, 1e-5, 1e-2), (ml_dtypes.bfloat16, 1e-4, 1e-1)):
        q, k, v, dout = (_rand(rng, 1, 100, 2, 32).astype(dt) for _ in range(4))
        O, _ = ref.attention_naive(q, k, v, True)
        err = np.abs(ref.attention_naive_same_dtype(q, k, v, True).astype(np.float64) - O).max()
        assert lo < err < hi
        exact = ref.attention_backward_naive(dout, q, k, v, True)
        low = ref.attention_backward_naive_same_dtype(dout, q, k, v, True)
        for a, b in zip(exact, low):
            assert b.dtype == dt
            assert lo < np.abs(b.astype(np.float64) - a).max() < hi


# ---- FlashAttention-1 ----------------------------------------------------------------------

def test_fa1_block_sizes_follow_the_seed():
    from cuflash import _plan
    cfg = _plan.fa1_config(128, 227 * 1024)      # H100/H200: M = 116224 elements
    assert cfg.B_c_seed == -(-116224 // (4 * 128)) == 227 and cfg.B_r_seed == 128
    assert (cfg.B_r, cfg.B_c) == (128, 128)      # rounded to tensor-core tiles
    cfg = _plan.fa1_config(64, 99 * 1024)
    assert cfg.B_c_seed == -(-50688 // 256) and cfg.B_r_seed == 64 and cfg.B_r == 64
    for HD in _plan.HEAD_DIM_BUCKETS:
        for smem in _plan.SMEM_CLASSES:
            c = _plan.fa1_config(HD, smem)
            assert c.smem_bytes <= smem and c.B_r <= min(c.B_c, HD) and c.B_r % 16 == 0
