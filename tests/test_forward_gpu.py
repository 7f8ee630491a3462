"""GPU: the FA2 forward kernel against float64 attention, by the accuracy rule
(max error <= 2x a same-dtype naive attention's), over every head dim, both dtypes, causal
on and off, odd sequence lengths both ways, MHA/GQA/MQA, strided inputs and batch > 1.
Every output buffer is poisoned with NaN before the launch."""

import itertools

import ml_dtypes
import numpy as np
import pytest
from gpu_helpers import SHIFTED_CASES, assert_accurate, assert_lse, poisoned, rand

from cuflash import _api, _loader, _plan, _registry, reference

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="CuPy not installed")

import cuflash  # noqa: E402

DTYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
HEAD_DIMS = list(range(8, 257, 8))
SEQLENS = [(113, 113), (1, 1), (17, 203), (203, 17), (1023, 1025), (1025, 1023), (3, 1023),
           (256, 256), (1, 113)]
HEADS = [(4, 4), (4, 2), (6, 1), (2, 2)]  # (nheads, nheads_k): MHA, GQA, MQA


@pytest.fixture(scope="module", autouse=True)
def warm_kernels():
    """Compile every specialisation once, in parallel (NVRTC), before the timed tests."""
    cuflash.precompile(fa1=True)


def _uses_hopper_family() -> bool:
    return cp.cuda.Device().compute_capability == "90"


def make_qkv(shape_q, shape_k, dtype, strided, scale_q=1.0, scale_kv=1.0):
    """q, k, v as the API wants them; strided=True gives (b, h, s, d) buffers seen through
    .transpose(0, 2, 1, 3), i.e. non-contiguous head and sequence strides."""
    def one(shape, scale):
        if strided:
            b, s, h, d = shape
            return rand(cp, (b, h, s, d), dtype, scale).transpose(0, 2, 1, 3)
        return rand(cp, shape, dtype, scale)
    return one(shape_q, scale_q), one(shape_k, scale_kv), one(shape_k, scale_kv)


def run_and_check(q, k, v, causal, softmax_scale=None, factor=2.0, algorithm="fa2",
                  **features):
    """features: window_size, softcap, alibi_slopes, as forward() takes them."""
    b, sq, h, d = q.shape
    out = poisoned(cp, q.shape, q.dtype)
    lse = poisoned(cp, (b, h, sq), cp.float32)
    out2, lse2 = cuflash.forward(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                 out=out, lse=lse, algorithm=algorithm, **features)
    assert out2 is out and lse2 is lse
    O_ref, L_ref = reference.attention_naive(q, k, v, causal, softmax_scale, **features)
    naive = reference.attention_naive_same_dtype(q, k, v, causal, softmax_scale, **features)
    errs = assert_accurate(cp, out, naive, O_ref, factor, "out")
    assert_lse(cp, lse, L_ref)
    return out, lse, errs


def _cases():
    """Every head dim x dtype x causal, the other parameters cycling through their lists so
    that each value of each appears many times."""
    cases = []
    for i, (d, dt, causal) in enumerate(itertools.product(HEAD_DIMS, DTYPES, (False, True))):
        sq, sk = SEQLENS[i % len(SEQLENS)]
        h, hk = HEADS[i % len(HEADS)]
        batch = 1 + i % 2
        strided = i % 3 == 0
        cases.append((d, dt, causal, batch, sq, sk, h, hk, strided))
    return cases


@pytest.mark.parametrize(
    "d,dt,causal,batch,sq,sk,h,hk,strided", _cases(),
    ids=lambda x: str(x))
def test_forward_accuracy_grid(d, dt, causal, batch, sq, sk, h, hk, strided, family):
    q, k, v = make_qkv((batch, sq, h, d), (batch, sk, hk, d), DTYPES[dt], strided)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize(
    "d,dt,causal,batch,sq,sk,h,hk,strided", _cases(),
    ids=lambda x: str(x))
def test_fa1_forward_accuracy_grid(d, dt, causal, batch, sq, sk, h, hk, strided):
    """FlashAttention-1 (algorithm="fa1") under the same rule and the same grid."""
    q, k, v = make_qkv((batch, sq, h, d), (batch, sk, hk, d), DTYPES[dt], strided)
    run_and_check(q, k, v, causal, algorithm="fa1")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_fa1_issue_size_large_inputs_and_masked_rows(dt, causal):
    q, k, v = make_qkv((2, 2048, 16, 128), (2, 2048, 16, 128), DTYPES[dt], False)
    run_and_check(q, k, v, causal, algorithm="fa1")
    q, k, v = make_qkv((2, 517, 4, 64), (2, 517, 2, 64), DTYPES[dt], True, 5.0, 3.0)
    out, lse, _ = run_and_check(q, k, v, causal, algorithm="fa1")
    assert bool(cp.isfinite(lse).all())
    q, k, v = make_qkv((2, 300, 4, 64), (2, 100, 4, 64), DTYPES[dt], False)
    out, lse, _ = run_and_check(q, k, v, causal, algorithm="fa1")
    if causal:  # rows 0..199 see no key
        assert bool((out[:, :200] == 0).all()) and bool(cp.isneginf(lse[:, :, :200]).all())


def test_fa1_verbose_prints_the_plan(capsys):
    q, k, v = make_qkv((1, 300, 2, 128), (1, 300, 2, 128), np.float16, False)
    cuflash.forward(q, k, v, algorithm="fa1", verbose=True)
    printed = capsys.readouterr().out
    assert "FA1 plan" in printed and "B_c = ceil(M / 4d)" in printed
    with pytest.raises(ValueError, match="algorithm"):
        cuflash.forward(q, k, v, algorithm="fa3")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_issue_example_size(dt, causal, family):
    q, k, v = make_qkv((2, 2048, 16, 128), (2, 2048, 16, 128), DTYPES[dt], False)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("dt", DTYPES)
def test_custom_softmax_scale(dt, family):
    q, k, v = make_qkv((2, 300, 4, 64), (2, 257, 2, 64), DTYPES[dt], True)
    run_and_check(q, k, v, True, softmax_scale=0.3)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_large_magnitude_inputs_stay_finite(dt, d, family):
    q, k, v = make_qkv((2, 517, 4, d), (2, 517, 4, d), DTYPES[dt], False, 5.0, 3.0)
    for causal in (False, True):
        out, lse, _ = run_and_check(q, k, v, causal)
        assert bool(cp.isfinite(lse).all())


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_row_maxima_rising_across_key_blocks(dt, causal, family):
    """Keys scaled up every 128 positions: each such jump lifts the row maxima by far more than
    2^8 in P~ and the keys between jumps by much less, so the lazy rescaling of the d 128 tile
    (sm_90, non-causal) both moves m_i and keeps it, within one row block."""
    q, k, v = make_qkv((2, 1024, 4, 128), (2, 1024, 4, 128), DTYPES[dt], False, 1.5)
    ramp = (1.0 + 2.0 * (cp.arange(1024) // 128)).astype(cp.float32)[None, :, None, None]
    k = (k.astype(cp.float32) * ramp).astype(k.dtype)
    out, lse, _ = run_and_check(q, k, v, causal)
    assert bool(cp.isfinite(lse).all())


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 192, 256])
def test_long_key_sequences(dt, causal, d, family):
    """Keys past every short-sequence limit (the Hopper family's SM90_SHORT_KEYS, the portable
    SHORT_KEYS), so that each bucket's usual tile runs too, plain and with the score hook
    (ALiBi, with and without the softcap: on Hopper the hook alone takes the plain call's
    tiles); odd lengths, GQA."""
    longest = max(max(limits) for table in (_plan.SM90_SHORT_KEYS, _plan.SHORT_KEYS)
                  for limits in table.values())
    q, k, v = make_qkv((1, 259, 4, d), (1, longest + 3, 2, d), DTYPES[dt], False)
    run_and_check(q, k, v, causal)
    slopes = cp.asarray(np.random.default_rng(d).uniform(0.01, 0.3, 4).astype(np.float32))
    for softcap in (0.0, 5.0):
        run_and_check(q, k, v, causal, softcap=softcap, alibi_slopes=slopes)


@pytest.fixture
def split_every_tail(monkeypatch):
    """The split tail wherever it applies, whatever a tile's column blocks and head dim (the
    planner's limits, _registry.SPLIT_TAIL_*, at their widest), the grids recomputed."""
    monkeypatch.setattr(_registry, "SPLIT_TAIL_MIN_BLOCKS", 2)
    monkeypatch.setattr(_registry, "SPLIT_TAIL_MAX_HEAD_DIM", 256)
    for cache in ("_sm90_grids", "_repeats"):
        monkeypatch.setattr(_api, cache, {})


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("d, sq, sk, hk", [(128, 1100, 1000, 1), (128, 259, 3001, 4),
                                           (64, 1000, 3001, 2), (96, 517, 333, 2),
                                           (256, 700, 1801, 1)])
def test_split_tail(dt, d, sq, sk, hk, family, split_every_tail, capsys):
    """More tiles than SMs, not in whole rounds, no mask: the Hopper forward splits its last
    tiles by column blocks between the blocks and merges the parts (fa2_forward_sm90.cu, the
    split tail). Odd lengths (rows past seqlen_q in the split tiles), a head dim below its
    bucket, GQA; a second call (the parts' counts back at zero) gives the same bits."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    cfg = _plan.sm90_forward_config(d, False, sk)
    T_r = -(-sq // cfg.B_r)
    h = hk * (-(-sms // (T_r * hk)) + 1)  # query heads, a multiple of hk
    while (T_r * h) % sms == 0:
        h += hk
    _, _, tail = _registry.sm90_forward_grid(cfg, False, sq, h, 1, sms, sk, True)
    assert tail > 0  # (what the Hopper family launches with)
    q, k, v = make_qkv((1, sq, h, d), (1, sk, hk, d), DTYPES[dt], False)
    out, lse, _ = run_and_check(q, k, v, False)
    again = cuflash.forward(q, k, v)
    assert bool((again[0] == out).all()) and bool(cp.array_equal(again[1], lse))
    if _uses_hopper_family() and family == "default":  # (the launch itself split its tail)
        cuflash.forward(q, k, v, verbose=True)
        assert f"the last {tail} split by column blocks" in capsys.readouterr().out
    # on a second stream (its own buffers), into a strided output, the same bits
    with cp.cuda.Stream():
        strided = cp.full((1, h, sq, d), np.nan, q.dtype).transpose(0, 2, 1, 3)
        cuflash.forward(q, k, v, out=strided)
        cp.cuda.get_current_stream().synchronize()
    assert bool((strided == out).all())


@pytest.mark.parametrize("dt", DTYPES)
def test_split_tail_batches(dt, family, split_every_tail):
    """The split tail over a batch of several entries (tiles of different entries split
    between blocks), against float64 attention."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    b = -(-sms // (9 * 8)) + 1
    while (b * 9 * 8) % sms == 0:
        b += 1
    q, k, v = make_qkv((b, 1100, 8, 128), (b, 1500, 2, 128), DTYPES[dt], True)
    run_and_check(q, k, v, False)


@pytest.fixture
def causal_every_tail(monkeypatch):
    """The causal tail wherever it applies, whatever a pair's row blocks (the planner's
    limit, _registry.CAUSAL_TAIL_MIN_ROW_BLOCKS, at its widest), the grids recomputed."""
    monkeypatch.setattr(_registry, "CAUSAL_TAIL_MIN_ROW_BLOCKS",
                        dict.fromkeys(_plan.SM90_HEAD_DIM_BUCKETS, 1))
    for cache in ("_sm90_grids", "_repeats"):
        monkeypatch.setattr(_api, cache, {})


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("d, sq, sk, hk, softcap", [(64, 640, 640, 2, 0.0),
                                                    (128, 1100, 1500, 1, 0.0),
                                                    (128, 700, 513, 2, 5.0),
                                                    (256, 515, 515, 1, 0.0)])
def test_causal_tail(dt, d, sq, sk, hk, softcap, causal_every_tail, capsys):
    """More causal units than SMs, not in whole rounds: the Hopper forward hands its last
    units out as single tiles, the longest first (fa2_forward_sm90.cu, the causal tail). An
    odd number of row blocks (a unit of the middle row alone), seqlen_q != seqlen_k both
    ways (rows that see no key: out 0, lse -inf), GQA, the hook; against float64 attention,
    into poisoned outputs (a tile handed out to no block would leave NaN)."""
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    cfg = _plan.sm90_forward_config(d, True, sk, hooked=softcap > 0)
    unit_rows = (-(-sq // cfg.B_r) + 1) // 2
    h = hk * (-(-sms // (unit_rows * hk)) + 1)  # query heads, a multiple of hk
    while (unit_rows * h) % sms == 0:
        h += hk
    _, per_unit, tail = _registry.sm90_forward_grid(cfg, True, sq, h, 1, sms, sk, False, True)
    assert per_unit == 2 and tail > 0  # (what the Hopper family launches with)
    q, k, v = make_qkv((1, sq, h, d), (1, sk, hk, d), DTYPES[dt], False)
    run_and_check(q, k, v, True, softcap=softcap)
    if _uses_hopper_family():  # (the launch itself had the causal tail)
        cuflash.forward(q, k, v, causal=True, softcap=softcap, verbose=True)
        assert f"the last {tail} units as single tiles" in capsys.readouterr().out


WINDOWS = [(0, 0), (5, 0), (64, -1), (127, 3), (-1, 17), (300, 300), (1000, 0)]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_sliding_windows(window, causal, d, family):
    """Sliding windows (FlashAttention-2's window_size) through both families: odd lengths
    both ways, GQA, rows at the edges that see no key (out = 0, lse = -inf)."""
    for sq, sk, dt in ((259, 1031, "bf16"), (700, 301, "fp16")):
        q, k, v = make_qkv((1, sq, 4, d), (1, sk, 2, d), DTYPES[dt], False)
        run_and_check(q, k, v, causal, window_size=window)


@pytest.mark.parametrize("softcap,alibi", [(30.0, None), (2.0, None), (0.0, "h"), (0.0, "bh"),
                                           (5.0, "bh")], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_softcap_and_alibi(softcap, alibi, causal, d, family):
    """The score hook (FlashAttention-2's softcap and ALiBi) through both families, with a
    window too; slopes per head or per (batch, head)."""
    rng = np.random.default_rng(d)
    for sq, sk, dt in ((259, 1031, "bf16"), (700, 301, "fp16")):
        q, k, v = make_qkv((2, sq, 4, d), (2, sk, 2, d), DTYPES[dt], False, 3.0)
        slopes = None if alibi is None else cp.asarray(
            rng.uniform(0.01, 0.5, (4,) if alibi == "h" else (2, 4)).astype(np.float32))
        run_and_check(q, k, v, causal, softcap=softcap, alibi_slopes=slopes)
        run_and_check(q, k, v, causal, softcap=softcap, alibi_slopes=slopes,
                      window_size=(97, 0 if causal else 13))


@pytest.mark.parametrize("shift", [-300, -37, 41, 500])
@pytest.mark.parametrize("causal,window,alibi", SHIFTED_CASES, ids=str)
@pytest.mark.parametrize("d", [64, 128, 59])
def test_forward_with_a_shifted_diagonal(shift, causal, window, alibi, d, family):
    """Ring attention's blocks (cuflash.distributed): the masks and ALiBi counted from a
    diagonal moved by diag_shift keys. The host folds the shift into the window's sides,
    which may then be negative, and ALiBi reads it from the parameters. Against the
    reference on the same shift: rows that see no key, blocks skipped on either side."""
    rng = np.random.default_rng(abs(shift) + d)
    q, k, v = make_qkv((2, 259, 4, d), (2, 301, 2, d), DTYPES["bf16"], False, 3.0)
    slopes = cp.asarray(rng.uniform(0.01, 0.3, (2, 4)).astype(np.float32)) if alibi else None
    out, lse = _api._forward(q, k, v, causal, None, None, None, "fa2", False, None, window,
                             0.0, slopes, diag_shift=shift)
    features = dict(window_size=window, alibi_slopes=slopes, diag_shift=shift)
    O_ref, L_ref = reference.attention_naive(q, k, v, causal, **features)
    naive = reference.attention_naive_same_dtype(q, k, v, causal, **features)
    assert_accurate(cp, out, naive, O_ref, 2.0, "out")
    assert_lse(cp, lse, L_ref)


def test_window_of_256_over_16k_keys(family):
    """A long sequence, where the window skips almost every block (the speed is in bench/)."""
    q, k, v = make_qkv((1, 257, 2, 128), (1, 16384, 2, 128), DTYPES["bf16"], False)
    run_and_check(q, k, v, True, window_size=(256, 0))


def run_varlen_and_check(lens_q, lens_k, h, hk, d, dt, causal, factor=2.0, **features):
    """forward_varlen on packed sequences of the given lengths against each sequence's float64
    and same-dtype naive attention (the accuracy rule over the whole packed output). Returns
    out, lse and the inputs (q, k, v, cu_seqlens_q, cu_seqlens_k)."""
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int64) for n in (lens_q, lens_k))
    q = rand(cp, (int(cu_q[-1]), h, d), dt)
    k, v = (rand(cp, (int(cu_k[-1]), hk, d), dt) for _ in range(2))
    out = poisoned(cp, q.shape, q.dtype)
    lse = poisoned(cp, (h, q.shape[0]), cp.float32)
    out2, lse2 = cuflash.forward_varlen(q, k, v, cu_q, cp.asarray(cu_k, dtype=cp.int32),
                                        max(lens_q), max(lens_k), causal, out=out, lse=lse,
                                        **features)
    assert out2 is out and lse2 is lse
    O_ref = cp.zeros(q.shape, cp.float64)
    L_ref = cp.zeros((h, q.shape[0]), cp.float64)
    naive = cp.zeros(q.shape, q.dtype)
    slopes = features.pop("alibi_slopes", None)
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if qs.start == qs.stop:
            continue
        one = {**features, "alibi_slopes": None if slopes is None else
               (slopes if slopes.ndim == 1 else slopes[b])}
        O_b, L_b = reference.attention_naive(q[None, qs], k[None, ks], v[None, ks], causal,
                                             **one)
        O_ref[qs], L_ref[:, qs] = O_b[0], L_b[0]
        naive[qs] = reference.attention_naive_same_dtype(q[None, qs], k[None, ks], v[None, ks],
                                                         causal, **one)[0]
    assert_accurate(cp, out, naive, O_ref, factor, "out")
    assert_lse(cp, lse, L_ref)
    return out, lse, (q, k, v, cu_q, cu_k)


# lengths (query, key) of the packed sequences: zero-length ones, one row, lengths that are
# not multiples of any tile, queries longer than keys (causal rows that see nothing) and the
# other way round
VARLEN_CASES = [
    ([1, 0, 129, 700, 64], [5, 3, 129, 1000, 0]),
    ([384, 17, 1], [300, 900, 2]),
]


@pytest.mark.parametrize("lens", VARLEN_CASES, ids=["mixed", "long-short"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_forward_varlen(lens, causal, d, family):
    """Variable-length batches through both families: each sequence as if alone, in both
    dtypes, GQA, with the masks aligned to each sequence's own corner."""
    for dt, (h, hk) in (("bf16", (4, 2)), ("fp16", (2, 2))):
        run_varlen_and_check(*lens, h, hk, d, DTYPES[dt], causal)


@pytest.mark.parametrize("d", [1, 3, 59, 111, 255])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_any_head_dim(d, causal, family):
    """Head dims that are not a multiple of 8 (the OddD kernels: element-wise loads and
    stores, zero-padded on chip; on Hopper the portable kernels): odd lengths, GQA, both
    dtypes, rows 2-byte aligned (a transposed view, and a view one element into its rows)."""
    q, k, v = make_qkv((2, 131, 4, d), (2, 257, 2, d), DTYPES["bf16"], False)
    run_and_check(q, k, v, causal)
    q, k, v = make_qkv((2, 131, 4, d), (2, 257, 2, d), DTYPES["fp16"], True)
    run_and_check(q, k, v, causal)
    wide = [rand(cp, (1, n, h, d + 3), DTYPES["bf16"]) for n, h in ((77, 4), (300, 4), (300, 4))]
    run_and_check(*(x[..., 1:d + 1] for x in wide), causal)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_odd_head_dim_with_every_feature(causal, family):
    """d = 59 with a window, softcap and ALiBi, and over a packed batch (d = 111)."""
    q, k, v = make_qkv((2, 200, 4, 59), (2, 333, 2, 59), DTYPES["bf16"], False)
    slopes = cp.asarray(np.random.default_rng(2).uniform(0.01, 0.3, (2, 4)).astype(np.float32))
    run_and_check(q, k, v, causal, window_size=(50, 0 if causal else 20), softcap=15.0,
                  alibi_slopes=slopes)
    run_varlen_and_check([200, 0, 77], [150, 9, 300], 4, 2, 111, DTYPES["fp16"], causal)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_varlen_many_tiles(causal, family):
    """More tiles than SMs, so that the Hopper kernel's blocks draw tiles from its scheduler
    (a counter, zero at each launch): every tile computed once, and a second call (a fresh
    counter) gives the same bits, whichever block took which tile."""
    rng = np.random.default_rng(7)
    lens_q = [int(n) for n in rng.integers(0, 700, 48)]
    lens_k = [int(n) for n in rng.integers(1, 700, 48)]
    h = 8
    assert h * sum(-(-n // 192) for n in lens_q) > 4 * 132  # (tiles: several per block)
    out, lse, (q, k, v, cu_q, cu_k) = run_varlen_and_check(lens_q, lens_k, h, 2, 64,
                                                           DTYPES["bf16"], causal)
    again = cuflash.forward_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal)
    assert bool((again[0] == out).all()) and bool(cp.array_equal(again[1], lse))


@pytest.mark.parametrize("causal", [False, True])
def test_forward_varlen_with_window_softcap_alibi(causal, family):
    """Every feature with a packed batch: a window, softcap, ALiBi slopes per (batch, head)."""
    lens_q, lens_k = [200, 0, 513, 31], [300, 7, 400, 31]
    slopes = cp.asarray(np.random.default_rng(0).uniform(0.01, 0.3, (4, 4)).astype(np.float32))
    run_varlen_and_check(lens_q, lens_k, 4, 2, 128, DTYPES["bf16"], causal,
                         window_size=(64, 0 if causal else 32), softcap=20.0,
                         alibi_slopes=slopes)
    run_varlen_and_check(lens_q, lens_k, 4, 1, 64, DTYPES["fp16"], causal,
                         window_size=(100, -1))


@pytest.mark.parametrize("dt", DTYPES)
def test_fully_masked_rows(dt, family):
    """seqlen_q > seqlen_k with a bottom-right causal mask: the first rows see no key."""
    q, k, v = make_qkv((2, 300, 4, 64), (2, 100, 4, 64), DTYPES[dt], False)
    out, lse, _ = run_and_check(q, k, v, True)
    assert bool((out[:, :200] == 0).all())
    assert bool(cp.isneginf(lse[:, :, :200]).all()) and bool(cp.isfinite(lse[:, :, 200:]).all())


def test_empty_inputs():
    q, k, v = make_qkv((0, 16, 2, 64), (0, 16, 2, 64), np.float16, False)
    out, lse = cuflash.forward(q, k, v)
    assert out.shape == (0, 16, 2, 64) and lse.shape == (0, 2, 16)
    q, k, v = make_qkv((2, 0, 2, 64), (2, 16, 2, 64), np.float16, False)
    out, lse = cuflash.forward(q, k, v)
    assert out.shape == (2, 0, 2, 64) and lse.shape == (2, 2, 0)


def test_no_keys_gives_zero_output(family):
    q, k, v = make_qkv((1, 5, 2, 64), (1, 0, 2, 64), np.float16, False)
    out, lse, _ = run_and_check(q, k, v, False)
    assert bool((out == 0).all()) and bool(cp.isneginf(lse).all())


def test_strided_output_buffer(family):
    q, k, v = make_qkv((2, 129, 4, 96), (2, 129, 4, 96), np.float16, False)
    out = cp.full((2, 4, 129, 96), np.nan, np.float16).transpose(0, 2, 1, 3)
    cuflash.forward(q, k, v, out=out)
    O_ref, _ = reference.attention_naive(q, k, v)
    naive = reference.attention_naive_same_dtype(q, k, v, False)
    assert_accurate(cp, out, naive, O_ref, 2.0, "out")


def test_packed_qkv_and_misaligned_views(family):
    """Views into a packed (b, s, 3, h, d) buffer, and a view at an odd element offset
    (not 16-byte aligned: cuflash copies it, the answer is still right)."""
    qkv = rand(cp, (2, 200, 3, 4, 64), np.float16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    run_and_check(q, k, v, True)
    flat = rand(cp, (2 * 200 * 4 * 64 + 1,), np.float16)
    q_odd = flat[1:].reshape(2, 200, 4, 64)
    assert q_odd.data.ptr % 16 != 0
    run_and_check(q_odd, k, v, False)


def test_repeatable_bitwise(family):
    """Same inputs, same bits: a changing answer would be a race."""
    q, k, v = make_qkv((2, 1000, 8, 128), (2, 1000, 4, 128), np.float16, False)
    for causal in (False, True):
        a, la = cuflash.forward(q, k, v, causal=causal)
        for _ in range(3):
            b, lb = cuflash.forward(q, k, v, causal=causal)
            assert bool((a == b).all()) and bool((la == lb).all())


def test_concurrent_calls_from_host_threads():
    """Launches from several host threads at once: each kernel's packed argument buffer is
    shared (ParamBuffer, guarded by its lock), so a race would launch one thread's problem with
    another's pointers or sizes. Every thread must get exactly its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    problems = [make_qkv((2, 100 + 37 * i, 4, 64), (2, 150 + 41 * i, 2, 64), np.float16, i % 2)
                for i in range(6)]
    expected = [cuflash.forward(*p, causal=True) for p in problems]

    def run(i):
        for _ in range(25):
            out, lse = cuflash.forward(*problems[i], causal=True)
        cp.cuda.get_current_stream().synchronize()
        return (bool((out == expected[i][0]).all()) and bool((lse == expected[i][1]).all()))

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert all(pool.map(run, range(6)))


def test_runs_on_current_stream(family):
    q, k, v = make_qkv((2, 333, 4, 64), (2, 333, 4, 64), ml_dtypes.bfloat16, False)
    # q, k, v were written on the default stream, which a non-blocking stream does not wait
    # for: the caller orders the streams (the test did not, and read unwritten inputs when
    # the GPU was busy).
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        out, lse = cuflash.forward(q, k, v, causal=True)
    stream.synchronize()
    O_ref, _ = reference.attention_naive(q, k, v, True)
    assert_accurate(cp, out, reference.attention_naive_same_dtype(q, k, v, True), O_ref, 2.0, "out")


def test_bad_output_buffers_rejected():
    q, k, v = make_qkv((1, 16, 2, 64), (1, 16, 2, 64), np.float16, False)
    with pytest.raises(ValueError, match="out must have shape"):
        cuflash.forward(q, k, v, out=cp.empty((1, 16, 2, 32), np.float16))
    with pytest.raises(ValueError, match="lse must have shape"):
        cuflash.forward(q, k, v, lse=cp.empty((1, 2, 16), cp.float64))


def test_gpu_input_validation():
    q, k, v = make_qkv((1, 16, 2, 64), (1, 16, 2, 64), np.float16, False)
    with pytest.raises(TypeError, match="same dtype"):
        cuflash.forward(q, k.astype(ml_dtypes.bfloat16), v)
    with pytest.raises(TypeError, match="float16 and bfloat16"):
        cuflash.forward(q.astype(cp.float32), k, v)
    wide = rand(cp, (1, 16, 2, 264), np.float16)  # (1..256 are taken; 12 is since issue 19)
    with pytest.raises(ValueError, match="head dim 264"):
        cuflash.forward(wide, wide, wide)
    with pytest.raises(ValueError, match="contiguous in its last"):
        big = rand(cp, (1, 16, 2, 128), np.float16)
        cuflash.forward(big[..., ::2], k, v)


def test_compile_error_names_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "common.cuh").write_text("#pragma once\n__device__ float helper() {\n"
                                         "  return undefined_name;\n}\n")
    (tmp_path / "broken.cu").write_text('#include "common.cuh"\n'
                                        'extern "C" __global__ void k(float* x) '
                                        '{ x[0] = helper(); }\n')
    monkeypatch.setattr(_loader, "KERNEL_DIR", tmp_path)
    with pytest.raises(cuflash.KernelCompileError, match=r"common.cuh:3: .*undefined_name"):
        _loader.get_kernel("broken.cu", "k")


def test_every_shipped_config_is_used_on_this_device():
    """The planner picks a tile for every bucket that fits this device's shared memory."""
    limit = cp.cuda.runtime.getDeviceProperties(0)["sharedMemPerBlockOptin"]
    for HD in _plan.HEAD_DIM_BUCKETS:
        for causal in (False, True):
            assert _plan.forward_config(HD, causal, limit).smem_bytes <= limit


def test_hopper_family_is_the_default_on_sm90(capsys):
    """On an sm_90 GPU forward() runs the Hopper kernel (its verbose plan says so), and
    portable_kernels() turns it off."""
    if not _uses_hopper_family():
        pytest.skip("not an sm_90 GPU: the Hopper family does not run here")
    q, k, v = make_qkv((1, 256, 2, 64), (1, 256, 2, 64), DTYPES["bf16"], False)
    cuflash.forward(q, k, v, verbose=True)
    assert "Hopper plan" in capsys.readouterr().out
    with cuflash.portable_kernels():
        cuflash.forward(q, k, v, verbose=True)
    assert "Hopper plan" not in capsys.readouterr().out
