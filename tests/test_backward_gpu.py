"""GPU: the FA2 backward against float64 gradients by the accuracy rule (max error <= 3x a
same-dtype naive attention's own gradients), over every head dim, both dtypes, causal on and
off, odd sequence lengths both ways, MHA/GQA/MQA and strided inputs; plus large inputs, fully
masked rows, the deterministic mode (bitwise over 20 runs), the VJP helper and a long
sequence whose memory stays linear. The tests that take `family` (conftest.py) run on both
backward families on an sm_90 GPU: the Hopper one (fa2_backward_sm90.cu, where it covers the
call) and the portable one."""


import ml_dtypes
import numpy as np
import pytest
from gpu_helpers import SHIFTED_CASES, assert_accurate, rand

from cuflash import _api, _registry, reference

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="CuPy not installed")

import cuflash  # noqa: E402

DTYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
SEQLENS = [(113, 113), (1, 1), (17, 203), (203, 17), (1023, 1025), (1025, 1023), (3, 1023),
           (256, 256), (129, 65)]
HEADS = [(4, 4), (4, 2), (6, 1), (2, 2)]


@pytest.fixture(scope="module", autouse=True)
def warm_kernels():
    cuflash.precompile()


def make_inputs(b, sq, sk, h, hk, d, dtype, strided=False, scale_q=1.0, scale_kv=1.0):
    def one(shape, scale):
        if strided:
            bb, s, hh, dd = shape
            return rand(cp, (bb, hh, s, dd), dtype, scale).transpose(0, 2, 1, 3)
        return rand(cp, shape, dtype, scale)
    q = one((b, sq, h, d), scale_q)
    k, v = one((b, sk, hk, d), scale_kv), one((b, sk, hk, d), scale_kv)
    dout = one((b, sq, h, d), 1.0)
    return q, k, v, dout


def poisoned_like(x):
    return cp.full(x.shape, np.nan, dtype=x.dtype)


def check_gradients(q, k, v, dout, causal, deterministic=False, **features):
    """features: window_size, softcap, alibi_slopes, as forward() and backward() take them."""
    out, lse = cuflash.forward(q, k, v, causal=causal, **features)
    dq, dk, dv = (poisoned_like(x) for x in (q, k, v))
    res = cuflash.backward(dout, q, k, v, out, lse, causal=causal, **features,
                           deterministic=deterministic, dq=dq, dk=dk, dv=dv)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    exact = reference.attention_backward_naive(dout, q, k, v, causal, **features)
    naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, causal, **features)
    for name, ours, nv, ex in zip(("dq", "dk", "dv"), (dq, dk, dv), naive, exact):
        assert_accurate(cp, ours, nv, ex, 3.0, name)
    return dq, dk, dv


def _cases():
    cases = []
    for i, d in enumerate(range(8, 257, 8)):
        for j, dt in enumerate(DTYPES):
            causal = (i + j) % 2 == 1
            sq, sk = SEQLENS[(2 * i + j) % len(SEQLENS)]
            h, hk = HEADS[(i + j) % len(HEADS)]
            cases.append((d, dt, causal, 1 + (i % 2), sq, sk, h, hk, (i + j) % 3 == 0))
    return cases


@pytest.mark.parametrize("d,dt,causal,batch,sq,sk,h,hk,strided", _cases(), ids=str)
def test_backward_accuracy_grid(d, dt, causal, batch, sq, sk, h, hk, strided, family):
    check_gradients(*make_inputs(batch, sq, sk, h, hk, d, DTYPES[dt], strided), causal)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_backward_issue_size(dt, causal, d, family):
    check_gradients(*make_inputs(2, 1024, 1024, 8, 8, d, DTYPES[dt]), causal)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_backward_large_magnitude_inputs_stay_finite(dt, d, family):
    q, k, v, dout = make_inputs(2, 300, 300, 4, 2, d, DTYPES[dt], scale_q=5.0, scale_kv=3.0)
    for causal in (False, True):
        check_gradients(q, k, v, dout, causal)


@pytest.mark.parametrize("dt", DTYPES)
def test_backward_fully_masked_rows(dt, family):
    q, k, v, dout = make_inputs(2, 300, 100, 4, 4, 64, DTYPES[dt])
    dq, dk, dv = check_gradients(q, k, v, dout, True)
    assert bool((dq[:, :200] == 0).all())


def test_hopper_backward_is_the_default_on_sm90(monkeypatch):
    """On an sm_90 GPU backward() runs the Hopper family for a call it covers (dense, d <= 128,
    windows, the deterministic mode, the softcap and ALiBi included), and the portable one
    under portable_kernels() and for d 256; accurate both ways."""
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("not an sm_90 GPU: the Hopper backward does not run here")
    taken = []
    real = _api._backward_sm90
    monkeypatch.setattr(_api, "_backward_sm90", lambda *a, **kw: taken.append(real(*a, **kw))
                        or taken[-1])
    for d, expected, features in ((64, [True], {}), (128, [True], {}), (256, [False], {}),
                                  (128, [True], {"window_size": (50, 0)}),
                                  (128, [True], {"deterministic": True}),
                                  (64, [True], {"softcap": 20.0}),
                                  (64, [True], {"alibi_slopes": cp.full((4,), 0.25,
                                                                        dtype=cp.float32)}),
                                  (128, [True], {"softcap": 20.0}),
                                  (128, [True], {"alibi_slopes": cp.full((4,), 0.25,
                                                                         dtype=cp.float32),
                                                 "deterministic": True})):
        taken.clear()
        check_gradients(*make_inputs(2, 300, 333, 4, 2, d, DTYPES["bf16"]), True, **features)
        assert taken == expected, (d, features, taken)
    taken.clear()
    with cuflash.portable_kernels():
        check_gradients(*make_inputs(2, 300, 333, 4, 2, 64, DTYPES["bf16"]), True)
    assert taken == []


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_hopper_backward_many_blocks_and_heads(causal, d):
    """More column blocks than SMs, a GQA group of 4 walked by each block, both dtypes."""
    for dt in DTYPES:
        check_gradients(*make_inputs(3, 2000, 2100, 8, 2, d, DTYPES[dt]), causal)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("d, b, sq, sk, h, hk, hook", [
    (128, 1, 1100, 1000, 4, 2, False),   # fewer tiles than SMs: every tile split
    (64, 2, 517, 3001, 6, 2, False),
    (96, 1, 259, 3001, 12, 6, False),    # 144 tiles: 132 whole, 12 split; d below its bucket
    (128, 1, 700, 1500, 4, 4, True),     # the softcap and ALiBi, strided inputs
    (64, 1, 700, 1500, 4, 4, True)])
def test_backward_split_tail(dt, d, b, sq, sk, h, hk, hook, monkeypatch):
    """The Hopper backward's split tail (fa2_backward_sm90.cu): the last tiles split by row
    steps, each part adding its dK_j, dV_j into float32 sums that the last part stores. Split
    wherever a last round is part empty (SPLIT_PART_COST 0): odd lengths, GQA, several batch
    entries. Against float64 gradients; then again (the sums and counts back at zero), on a
    second stream (its own buffers) and unsplit, the same gradients up to the float32 order
    of the parts' sums."""
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("not an sm_90 GPU: the Hopper backward does not run here")
    monkeypatch.setattr(_registry, "SPLIT_PART_COST", 0)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    tiles = -(-sk // 128) * hk * b
    assert _registry.sm90_backward_split(tiles, -(-sq // 64) * (h // hk), sms)[1] > 1
    features = {"softcap": 5.0, "alibi_slopes": cp.full((h,), 0.3, dtype=cp.float32)} \
        if hook else {}
    q, k, v, dout = make_inputs(b, sq, sk, h, hk, d, DTYPES[dt], strided=hook)
    grads = check_gradients(q, k, v, dout, False, **features)
    out, lse = cuflash.forward(q, k, v, **features)

    def close(got):
        for name, g, w in zip(("dq", "dk", "dv"), got, grads):
            g, w = g.astype(cp.float32), w.astype(cp.float32)
            assert float(cp.abs(g - w).max()) <= 0.02 * float(cp.abs(w).max()), name
    close(cuflash.backward(dout, q, k, v, out, lse, **features))
    with cp.cuda.Stream():
        again = cuflash.backward(dout, q, k, v, out, lse, **features)
        cp.cuda.get_current_stream().synchronize()
    close(again)
    monkeypatch.setattr(_registry, "SPLIT_MAX_PARTS", 1)  # (unsplit)
    close(cuflash.backward(dout, q, k, v, out, lse, **features))


@pytest.mark.parametrize("d", [96, 128, 192, 224])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_is_bitwise_repeatable(causal, d, family):
    q, k, v, dout = make_inputs(2, 1000, 1000, 8, 4, d, ml_dtypes.bfloat16)
    first = check_gradients(q, k, v, dout, causal, deterministic=True)
    out, lse = cuflash.forward(q, k, v, causal=causal)
    for _ in range(20):
        again = cuflash.backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
        for a, b in zip(first, again):
            assert bool((a == b).all())


@pytest.mark.parametrize("sq,sk", [(1023, 1025), (700, 300), (300, 700), (1, 129), (129, 65)])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_accuracy_odd_lengths(sq, sk, causal, family):
    """Deterministic mode at uneven lengths: under a causal mask some dQ slices never receive
    some row blocks (the dQ sum must skip them, not read them)."""
    check_gradients(*make_inputs(2, sq, sk, 4, 2, 64, np.float16), causal, deterministic=True)


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_more_column_blocks_than_sms(causal, family):
    """One (batch, head) with more column blocks than the GPU has SMs: on sm_90 the ordered dQ
    additions wait only on blocks started earlier, so this must finish, and agree with the
    default mode of the same kernel family up to the order of the float32 sums (one missing
    or doubled column block of the ~140 would move dQ by ~7e-4 relative; the two families,
    different kernels (the Hopper one takes dS from P in float32, not rounded), measured
    4.8e-4 apart)."""
    from cuflash import _api
    sms = _api._device_properties(cp, cp.cuda.Device().id)["multiProcessorCount"]
    n = (sms + 8) * 128 + 37  # > sms column blocks at B_c <= 128
    q, k, v, dout = make_inputs(1, n, n, 2, 1, 64, np.float16)
    out, lse = cuflash.forward(q, k, v, causal=causal)
    default = cuflash.backward(dout, q, k, v, out, lse, causal=causal)
    det = cuflash.backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
    again = cuflash.backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
    for name, a, b, c in zip(("dq", "dk", "dv"), det, default, again):
        assert bool((a == c).all()), f"{name}: two deterministic runs differ"
        a, b = a.astype(cp.float64), b.astype(cp.float64)
        rel = float(cp.linalg.norm(a - b) / cp.linalg.norm(b))
        assert rel < 1e-4, f"{name}: deterministic vs default, relative difference {rel:.2e}"


@pytest.mark.parametrize("d", [64, 128])
def test_hopper_deterministic_wave_groups_agree(d, monkeypatch):
    """The Hopper backward's deterministic mode without the causal mask groups the (batch, kv
    head) pairs H at a time (_registry.ordered_wave_heads): whatever H, every block finds its
    pair and the additions into each row block keep their order, so dQ, dK, dV are bitwise the
    same for H = all 12 pairs, 4, 2 and 1, and accurate (GQA, odd lengths, 3 batch entries)."""
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("not an sm_90 GPU: the Hopper backward does not run here")
    from cuflash import _registry
    q, k, v, dout = make_inputs(3, 1000, 1100, 8, 4, d, ml_dtypes.bfloat16)
    first = check_gradients(q, k, v, dout, False, deterministic=True)
    out, lse = cuflash.forward(q, k, v)
    chosen = []
    for H in (12, 4, 2, 1):
        monkeypatch.setattr(_registry, "ordered_wave_heads",
                            lambda pairs, sms, H=H: chosen.append(pairs) or H)
        again = cuflash.backward(dout, q, k, v, out, lse, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert bool((a == b).all()), f"{name}: H = {H} differs"
    assert chosen == [12] * 4  # (the Hopper kernel ran, with 3 x 4 pairs)


@pytest.mark.parametrize("d,causal", [(64, True), (128, False)])
def test_deterministic_with_atomics(d, causal):
    """The deterministic mode of the dQ-atomics kernels (sm_80-89's path, split slices), also
    run on sm_90: accurate, and bitwise repeatable."""
    from cuflash import _api, _plan
    dev = cp.cuda.Device().id
    cfg = _plan.backward_config(d, _api._max_smem(cp, dev), bulk=False)
    assert cfg.dq_bulk == 0
    q, k, v, dout = make_inputs(2, 1000, 1000, 4, 2, d, ml_dtypes.bfloat16)
    out, lse = cuflash.forward(q, k, v, causal=causal)
    first = _api._backward(dout, q, k, v, out, lse, causal, None, True, None, None, None, cfg)
    exact = reference.attention_backward_naive(dout, q, k, v, causal)
    naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, causal)
    for name, ours, nv, ex in zip(("dq", "dk", "dv"), first, naive, exact):
        assert_accurate(cp, ours, nv, ex, 3.0, name)
    for _ in range(5):
        again = _api._backward(dout, q, k, v, out, lse, causal, None, True, None, None, None,
                               cfg)
        for a, b in zip(first, again):
            assert bool((a == b).all())


@pytest.mark.parametrize("window", [(0, 0), (5, 0), (64, -1), (127, 3), (-1, 17), (1000, 0)],
                         ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_sliding_windows(window, causal, deterministic, family):
    """Gradients with sliding windows, odd lengths both ways, GQA; the deterministic mode's
    dQ pass with row blocks that no key block reaches."""
    for sq, sk, d, dt in ((259, 531, 64, "bf16"), (400, 161, 64, "fp16"),
                          (400, 161, 128, "fp16")):
        q, k, v, dout = make_inputs(1, sq, sk, 4, 2, d, DTYPES[dt])
        check_gradients(q, k, v, dout, causal, deterministic, window_size=window)


@pytest.mark.parametrize("softcap,alibi", [(30.0, False), (2.0, False), (0.0, True),
                                           (5.0, True)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_softcap_and_alibi(softcap, alibi, causal, deterministic, family):
    """Gradients through the score hook (the softcap's 1 - tanh^2; ALiBi's bias has none); on
    an sm_90 GPU they run the Hopper backward's hooked kernels by default (d 128: dP^T issued
    after the hook's pass)."""
    rng = np.random.default_rng(3)
    for sq, sk, d, dt in ((259, 531, 64, "bf16"), (400, 161, 64, "fp16"),
                          (400, 161, 128, "fp16"), (259, 531, 128, "bf16")):
        q, k, v, dout = make_inputs(2, sq, sk, 4, 2, d, DTYPES[dt], scale_q=3.0)
        slopes = cp.asarray(rng.uniform(0.01, 0.5, (2, 4)).astype(np.float32)) if alibi \
            else None
        check_gradients(q, k, v, dout, causal, deterministic, softcap=softcap,
                        alibi_slopes=slopes)


@pytest.mark.parametrize("shift", [-300, -37, 41, 500])
@pytest.mark.parametrize("causal,window,alibi", SHIFTED_CASES, ids=str)
@pytest.mark.parametrize("d", [64, 128, 59])
def test_backward_with_a_shifted_diagonal(shift, causal, window, alibi, d, family):
    """Gradients of ring attention's blocks: the masks and ALiBi counted from a diagonal
    moved by diag_shift keys (_api._window folds it into the window's sides), against the
    reference on the same shift."""
    rng = np.random.default_rng(abs(shift) + d)
    q, k, v, dout = make_inputs(2, 259, 301, 4, 2, d, DTYPES["bf16"], scale_q=3.0)
    slopes = cp.asarray(rng.uniform(0.01, 0.3, (2, 4)).astype(np.float32)) if alibi else None
    out, lse = _api._forward(q, k, v, causal, None, None, None, "fa2", False, None, window,
                             0.0, slopes, diag_shift=shift)
    grads = _api._backward(dout, q, k, v, out, lse, causal, None, False, None, None, None, None,
                           window, 0.0, slopes, diag_shift=shift)
    features = dict(window_size=window, alibi_slopes=slopes, diag_shift=shift)
    exact = reference.attention_backward_naive(dout, q, k, v, causal, **features)
    naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, causal, **features)
    for name, ours, nv, ex in zip(("dq", "dk", "dv"), grads, naive, exact):
        assert_accurate(cp, ours, nv, ex, 3.0, name)


@pytest.mark.parametrize("d", [1, 3, 59, 111, 255])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_any_head_dim(d, causal):
    """Head dims that are not a multiple of 8 (the OddD kernels): odd lengths, GQA (its float32
    dK, dV slices where one part per kv head leaves SMs idle), both dtypes, 2-byte aligned
    rows (transposed views), the deterministic mode."""
    q, k, v, dout = make_inputs(1, 131, 257, 4, 2, d, DTYPES["bf16"])
    check_gradients(q, k, v, dout, causal)
    q, k, v, dout = make_inputs(2, 200, 77, 4, 1, d, DTYPES["fp16"], strided=True)
    check_gradients(q, k, v, dout, causal, deterministic=True)


def test_backward_odd_head_dim_with_every_feature():
    """d = 59 with a window, softcap and ALiBi."""
    q, k, v, dout = make_inputs(2, 259, 131, 4, 2, 59, DTYPES["bf16"], scale_q=3.0)
    slopes = cp.asarray(np.random.default_rng(4).uniform(0.01, 0.5, (2, 4)).astype(np.float32))
    check_gradients(q, k, v, dout, True, window_size=(40, 0), softcap=10.0, alibi_slopes=slopes)


def check_varlen_gradients(lens_q, lens_k, h, hk, d, dt, causal, deterministic=False,
                           alibi=False, **features):
    """backward_varlen against each sequence's float64 and same-dtype naive gradients (the 3x
    rule over the packed gradients); keys that no query sees must get zero gradients."""
    slopes = cp.asarray(np.random.default_rng(1).uniform(0.01, 0.3, (len(lens_q), h))
                        .astype(np.float32)) if alibi else None
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]) for n in (lens_q, lens_k))
    q, dout = (rand(cp, (int(cu_q[-1]), h, d), dt) for _ in range(2))
    k, v = (rand(cp, (int(cu_k[-1]), hk, d), dt) for _ in range(2))
    out, lse = cuflash.forward_varlen(q, k, v, cu_q, cu_k, causal=causal, alibi_slopes=slopes,
                                      **features)
    dq, dk, dv = (poisoned_like(x) for x in (q, k, v))
    res = cuflash.backward_varlen(dout, q, k, v, out, lse, cu_q, cp.asarray(cu_k, cp.int32),
                                  max(lens_q), max(lens_k), causal=causal, alibi_slopes=slopes,
                                  deterministic=deterministic, dq=dq, dk=dk, dv=dv, **features)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    exact = [cp.zeros(x.shape, cp.float64) for x in (q, k, v)]
    naive = [cp.zeros(x.shape, x.dtype) for x in (q, k, v)]
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if qs.start == qs.stop or ks.start == ks.stop:
            continue
        one = dict(features, alibi_slopes=None if slopes is None else slopes[b])
        args = (dout[None, qs], q[None, qs], k[None, ks], v[None, ks], causal)
        for acc, grads in ((exact, reference.attention_backward_naive(*args, **one)),
                           (naive, reference.attention_backward_naive_same_dtype(*args, **one))):
            for a, g, rows in zip(acc, grads, (qs, ks, ks)):
                a[rows] = g[0]
    for name, ours, nv, ex in zip(("dq", "dk", "dv"), (dq, dk, dv), naive, exact):
        assert_accurate(cp, ours, nv, ex, 3.0, name)
    for b in range(len(lens_q)):  # (sequences with no queries)
        if lens_q[b] == 0:
            assert bool((dk[int(cu_k[b]):int(cu_k[b + 1])] == 0).all())


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("features", [{}, {"window_size": (64, 0), "softcap": 20.0,
                                           "alibi": True}], ids=["plain", "window-softcap-alibi"])
def test_backward_varlen(causal, features, deterministic):
    """Zero-length sequences, queries longer than keys and the other way round, GQA; the packed
    kernels (deterministic=False) and the deterministic path (each sequence on its own)."""
    check_varlen_gradients([1, 0, 129, 300, 64], [5, 3, 129, 200, 0], 4, 2, 64, DTYPES["bf16"],
                           causal, deterministic, **features)


@pytest.mark.parametrize("d", [64, 111, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_varlen_many_entries(d, causal):
    """The packed kernels over many entries of mixed lengths (more column blocks than SMs),
    MQA, fp16, every head-dim bucket's tile family (111: OddD)."""
    rng = np.random.default_rng(d)
    lens_q = [int(n) for n in rng.integers(0, 400, 24)]
    lens_k = [int(n) for n in rng.integers(0, 400, 24)]
    check_varlen_gradients(lens_q, lens_k, 4, 1, d, DTYPES["fp16"], causal)


def test_backward_varlen_workspace_is_compact():
    """One long entry among many short ones: the packed backward's float32 dQ sums cover the
    entries' own rows (the whole call allocates far less than the padded batch's dQ workspace
    alone), and the gradients keep the accuracy rule."""
    lens = [4096] + [17] * 40
    check_varlen_gradients(lens, lens, 4, 2, 128, DTYPES["bf16"], True)
    cu = np.concatenate([[0], np.cumsum(lens)])
    q, dout = (rand(cp, (int(cu[-1]), 4, 128), DTYPES["bf16"]) for _ in range(2))
    k, v = (rand(cp, (int(cu[-1]), 2, 128), DTYPES["bf16"]) for _ in range(2))
    out, lse = cuflash.forward_varlen(q, k, v, cu, cu, causal=True)
    cu_dev = cp.asarray(cu, dtype=cp.int32)
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    pool.free_all_blocks()
    before = pool.total_bytes()
    cuflash.backward_varlen(dout, q, k, v, out, lse, cu_dev, cu_dev, 4096, 4096, causal=True)
    cp.cuda.Device().synchronize()
    padded = len(lens) * 4 * 4096 * 128 * 4  # (entries, heads, longest, HD) float32
    assert pool.total_bytes() - before < padded / 4


def test_empty_and_keyless_backward(family):
    q, k, v, dout = make_inputs(1, 5, 0, 2, 2, 64, np.float16)
    out, lse = cuflash.forward(q, k, v)
    dq, dk, dv = cuflash.backward(dout, q, k, v, out, lse)
    assert bool((dq == 0).all()) and dk.shape == k.shape and dv.shape == v.shape


def test_vjp_helper_matches_backward(family):
    q, k, v, dout = make_inputs(2, 200, 300, 4, 2, 64, np.float16)
    out, vjp = cuflash.attention_with_vjp(q, k, v, causal=True)
    out2, lse = cuflash.forward(q, k, v, causal=True)
    assert bool((out == out2).all())
    exact = reference.attention_backward_naive(dout, q, k, v, True)
    naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, True)
    for name, ours, nv, ex in zip(("dq", "dk", "dv"), vjp(dout), naive, exact):
        assert_accurate(cp, ours, nv, ex, 3.0, name)


def test_long_sequence_memory_is_linear():
    """seqlen 65536, 16 heads, d=128, bf16: a naive attention would need ~256 GB for S and P."""
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    n, h, d = 65536, 16, 128
    q, k, v, dout = make_inputs(1, n, n, h, h, d, ml_dtypes.bfloat16)
    out, lse = cuflash.forward(q, k, v, causal=True)
    dq, dk, dv = cuflash.backward(dout, q, k, v, out, lse, causal=True)
    cp.cuda.Device().synchronize()
    peak = pool.total_bytes()
    for g in (out, dq, dk, dv):
        assert bool(cp.isfinite(g.astype(cp.float32)).all())
    tensor = n * h * d * 2  # one (1, n, h, d) bf16 array
    print(f"\nseqlen {n}: memory pool peak {peak / 2**30:.2f} GiB "
          f"({peak / tensor:.1f}x one input tensor of {tensor / 2**20:.0f} MiB)")
    # q, k, v, dout, out, dq, dk, dv + float32 dQ accumulator + lse/D: about 10-12 tensors
    assert peak < 16 * tensor
    # Spot-check dq of a few query rows against float64, row by row (row i sees keys 0..i).
    scale = 1.0 / np.sqrt(d)
    for i in (0, 1, 4097, n - 1):
        Qi, dOi = q[0, i].astype(cp.float64), dout[0, i].astype(cp.float64)      # (h, d)
        Kp, Vp = k[0, :i + 1].astype(cp.float64), v[0, :i + 1].astype(cp.float64)  # (i+1, h, d)
        S = scale * cp.einsum("hd,jhd->hj", Qi, Kp)
        P = cp.exp(S - S.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        Oi = cp.einsum("hj,jhd->hd", P, Vp)
        dS = P * (cp.einsum("hd,jhd->hj", dOi, Vp) - (dOi * Oi).sum(axis=1, keepdims=True))
        dq_ref = scale * cp.einsum("hj,jhd->hd", dS, Kp)
        err = float(cp.abs(dq[0, i].astype(cp.float64) - dq_ref).max())
        assert err <= 2e-2 * float(cp.abs(dq_ref).max()) + 1e-3, (i, err)


def test_ordered_deterministic_under_contention(family):
    """The ordered deterministic backward (sm_90) waits on other blocks, so a block's place
    among the column blocks comes from a ticket taken when it starts, not from its block index
    (CUDA does not promise that blocks start in index order). With another stream's kernel
    holding most SMs when it launches, so that its blocks start as SMs come free, it must
    finish and give the same bits as alone."""
    from cuflash import _api
    dev = cp.cuda.Device()
    props = _api._device_properties(cp, dev.id)
    sms, smem = props["multiProcessorCount"], int(props["sharedMemPerBlockOptin"])
    hog = cp.RawKernel(r'''
    extern "C" __global__ void hog(long long cycles) {
        extern __shared__ int s[];
        long long t0 = clock64();
        while (clock64() - t0 < cycles) { s[threadIdx.x] = 0; }
    }''', "hog")
    hog.max_dynamic_shared_size_bytes = smem
    q, k, v, dout = make_inputs(2, 3000, 3000, 8, 2, 64, ml_dtypes.bfloat16)
    for causal in (False, True):
        out, lse = cuflash.forward(q, k, v, causal=causal)
        alone = cuflash.backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
        dev.synchronize()
        side = cp.cuda.Stream(non_blocking=True)
        with side:  # ~50 ms on all but 4 SMs, one block per SM (its shared memory fills it)
            hog((sms - 4,), (32,), (np.int64(props["clockRate"] * 50),), shared_mem=smem)
        busy = cuflash.backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
        dev.synchronize()
        for a, b in zip(alone, busy):
            assert bool((a == b).all())
