"""GPU: forward_kvcache (issue 20) against the float64 decode reference
(cuflash.reference.attention_kvcache_naive) by the accuracy rule (max error <= 2x a same-dtype
naive attention's over the same keys): contiguous and paged caches (pages of 16 and 256,
shuffled, odd page counts), cache lengths 0..70k, GQA ratios 1/4/8, with and without the
append (seqlen_new 1 and 3, causal bottom-right), one split, the chosen split count and many,
windows, softcap and ALiBi, both dtypes. The append's writes are checked against
reference.kvcache_append, bit for bit."""

import ml_dtypes
import numpy as np
import pytest
from gpu_helpers import assert_accurate, assert_lse, rand

from cuflash import _kvcache, _plan, reference

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="CuPy not installed")

import cuflash  # noqa: E402

DTYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def _paged(cache, page, order):
    """The contiguous cache (batch, capacity, heads_k, d) as pages in the shuffled `order`
    (page order[b * per + p] holds entry b's p-th block) and its block table."""
    batch, cap = cache.shape[:2]
    per = cap // page
    pages = cp.empty((batch * per, page) + cache.shape[2:], dtype=cache.dtype)
    pages[cp.asarray(order)] = cache.reshape((batch * per, page) + cache.shape[2:])
    return pages, order.reshape(batch, per).astype(np.int32)


def run_decode(lens, h, hk, d, dt, seqlen_q=1, seqlen_new=0, causal=False, page=None,
               num_splits=0, device_lens=False, **features):
    """forward_kvcache on random caches against the float64 and same-dtype references."""
    batch = len(lens)
    cap = max(lens) + seqlen_new + 5
    if page:
        cap = -(-cap // page) * page
    kc, vc = rand(cp, (batch, cap, hk, d), dt), rand(cp, (batch, cap, hk, d), dt)
    q = rand(cp, (batch, seqlen_q, h, d), dt, 2.0)
    k = v = None
    if seqlen_new:
        k, v = rand(cp, (batch, seqlen_new, hk, d), dt), rand(cp, (batch, seqlen_new, hk, d), dt)
    table = None
    if page:
        order = np.random.default_rng(len(lens) + cap).permutation(batch * cap // page)
        kc, table = _paged(kc, page, order)
        vc, _ = _paged(vc, page, order)
    host = {name: None if x is None else cp.asnumpy(x)
            for name, x in (("q", q), ("kc", kc), ("vc", vc), ("k", k), ("v", v))}
    slopes = features.pop("alibi_slopes", None)
    ref_features = dict(features, alibi_slopes=None if slopes is None else cp.asnumpy(slopes))
    O_ref, L_ref = reference.attention_kvcache_naive(
        host["q"].astype(np.float64), host["kc"].astype(np.float64),
        host["vc"].astype(np.float64), np.array(lens),
        k=None if k is None else host["k"].astype(np.float64),
        v=None if v is None else host["v"].astype(np.float64), block_table=table,
        causal=causal, **ref_features)
    kc_after, vc_after = (reference.kvcache_append(host["kc"], host["vc"], np.array(lens),
                                                   host["k"], host["v"], table)
                          if k is not None else (host["kc"], host["vc"]))
    naive = np.zeros(q.shape, dtype=dt)
    for b in range(batch):
        n = lens[b] + seqlen_new
        K, V = (reference.cache_rows(x, b, n, table)[None] for x in (kc_after, vc_after))
        s = ref_features["alibi_slopes"]
        naive[b] = reference.attention_naive_same_dtype(
            host["q"][b:b + 1], K, V, causal,
            **dict(features, alibi_slopes=None if s is None else (s if s.ndim == 1 else s[b]))
        )[0]
    seqlens = cp.asarray(lens, dtype=cp.int32) if device_lens else lens
    out, lse = cuflash.forward_kvcache(
        q, kc, vc, seqlens, k=k, v=v,
        block_table=None if table is None else (cp.asarray(table) if device_lens else table),
        causal=causal, num_splits=num_splits, alibi_slopes=slopes, **features)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_accurate(cp, out, cp.asarray(naive), cp.asarray(O_ref), 2.0, "out")
    assert_lse(cp, lse, cp.asarray(L_ref))
    if k is not None:  # the append, in place, exactly where the reference puts it
        np.testing.assert_array_equal(cp.asnumpy(kc).view(np.uint16), kc_after.view(np.uint16))
        np.testing.assert_array_equal(cp.asnumpy(vc).view(np.uint16), vc_after.view(np.uint16))
    return out, lse


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("h, hk", [(8, 8), (32, 8), (8, 1)])
@pytest.mark.parametrize("d", [64, 128, 40, 256, 96])
def test_decode_contiguous(dtype, h, hk, d):
    run_decode([1, 77, 1000, 4097], h, hk, d, DTYPES[dtype])


@pytest.mark.parametrize("page", [16, 24, 48, 256])
@pytest.mark.parametrize("h, hk", [(32, 8), (4, 4)])
def test_decode_paged(page, h, hk):
    run_decode([3, 517, 2049], h, hk, 128, DTYPES["bf16"], page=page)


@pytest.mark.parametrize("d", [64, 256, 96])
@pytest.mark.parametrize("num_splits", [0, 40])
def test_decode_paged_head_dims_and_splits(d, num_splits):
    """Paged caches at the other head-dim buckets (64 and 256 read the block table a block
    ahead, 96 copy by copy) and past 32 splits (the combine's second round of weights)."""
    run_decode([3, 700, 1500], 8, 2, d, DTYPES["fp16"], page=16, num_splits=num_splits)


@pytest.mark.parametrize("page", [None, 16])
@pytest.mark.parametrize("seqlen_new", [1, 3])
def test_decode_append_causal(page, seqlen_new):
    """The new keys written in place, then seqlen_q = seqlen_new queries attend with the causal
    mask aligned bottom-right (speculative decoding, chunked prefill)."""
    run_decode([0, 33, 1200], 16, 4, 128, DTYPES["fp16"], seqlen_q=seqlen_new,
               seqlen_new=seqlen_new, causal=True, page=page)


@pytest.mark.parametrize("num_splits", [1, 3, 64])
def test_decode_split_counts(num_splits):
    run_decode([5, 3000, 8191], 32, 8, 128, DTYPES["bf16"], num_splits=num_splits)


def test_decode_split_merge_repeats_and_streams():
    """Split-KV's partials and their merge, called again and again: 30 calls in a row on one
    stream, then calls alternating between two streams with two shapes (the partials'
    buffers recycled by CuPy's pool on each stream), all equal to the first call's result,
    bit for bit."""
    dt = DTYPES["bf16"]
    kc, vc = rand(cp, (2, 3000, 8, 128), dt), rand(cp, (2, 3000, 8, 128), dt)
    q = rand(cp, (2, 1, 32, 128), dt, 2.0)
    lens = cp.asarray([2999, 1500], dtype=cp.int32)
    want, want_lse = cuflash.forward_kvcache(q, kc, vc, lens, num_splits=5)
    small_q = q[:1, :, :8]
    small_k, small_v = kc[:1, :, :2], vc[:1, :, :2]
    small, small_lse = cuflash.forward_kvcache(small_q, small_k, small_v, lens[:1], num_splits=7)
    for _ in range(30):
        out, lse = cuflash.forward_kvcache(q, kc, vc, lens, num_splits=5)
        assert cp.array_equal(out, want) and cp.array_equal(lse, want_lse)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    cp.cuda.Device().synchronize()
    got = []
    for i in range(20):
        with streams[i % 2]:
            if i % 4 < 2:
                got.append((cuflash.forward_kvcache(q, kc, vc, lens, num_splits=5), want,
                            want_lse))
            else:
                got.append((cuflash.forward_kvcache(small_q, small_k, small_v, lens[:1],
                                                    num_splits=7), small, small_lse))
    cp.cuda.Device().synchronize()
    for (out, lse), ref_out, ref_lse in got:
        assert cp.array_equal(out, ref_out) and cp.array_equal(lse, ref_lse)


def test_decode_long_cache():
    run_decode([70000], 32, 8, 128, DTYPES["bf16"])
    run_decode([65536, 1], 8, 1, 64, DTYPES["fp16"], page=256)


@pytest.mark.parametrize("features", [
    {"window_size": (256, 0)},
    {"softcap": 30.0},
    {"alibi": True},
    {"softcap": 10.0, "alibi": True, "window_size": (100, -1)},
])
def test_decode_features(features):
    features = dict(features)
    if features.pop("alibi", False):
        features["alibi_slopes"] = cp.asarray(
            np.random.default_rng(3).uniform(0.01, 0.3, (3, 16)).astype(np.float32))
    run_decode([1, 700, 3000], 16, 4, 128, DTYPES["bf16"], seqlen_q=2, seqlen_new=2,
               causal=True, **features)


@pytest.mark.parametrize("window", [(-1, -1), (100, 13)], ids=str)
@pytest.mark.parametrize("softcap", [0.0, 10.0])
def test_decode_alibi_d64_not_causal(window, softcap):
    """ALiBi at d 64 without the causal mask: the decode kernel splits its term into a part
    per element and one per row on the blocks left of the rows' diagonal, and keeps the
    whole term on the block that crosses it (score.cuh, split_alibi_both_sides)."""
    slopes = cp.asarray(np.random.default_rng(5).uniform(0.01, 0.3, (3, 16)).astype(np.float32))
    run_decode([1, 700, 3000], 16, 4, 64, DTYPES["fp16"], seqlen_q=2, seqlen_new=2,
               causal=False, window_size=window, softcap=softcap, alibi_slopes=slopes)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_every_decode_tile(d):
    """Each tile of the decode table (one GPU runs only the largest that fits; the smaller
    ones serve GPUs with less shared memory: two stages, two warps) and the streaming tiles
    (_plan.DECODE_STREAM, for launches that fill the GPU unsplit) against the planner's
    tile's output, causal with append and paging, within the accuracy rule of each other."""
    dt = DTYPES["bf16"]
    lens = [3, 700, 2100]
    q = rand(cp, (3, 2, 8, d), dt)
    kc0, vc0 = rand(cp, (3, 2200, 2, d), dt), rand(cp, (3, 2200, 2, d), dt)
    k, v = rand(cp, (3, 2, 2, d), dt), rand(cp, (3, 2, 2, d), dt)
    smem = cp.cuda.runtime.getDeviceProperties(0)["sharedMemPerBlockOptin"]
    outs = []
    table = _plan.TILES[("any", "decode", _plan.head_dim_bucket(d), False)]
    for cfg in table + [_plan.DECODE_STREAM[c] for c in table if c in _plan.DECODE_STREAM]:
        if cfg.smem_bytes > smem:
            continue
        kc, vc = kc0.copy(), vc0.copy()
        out, lse = _kvcache._forward_kvcache(q, kc, vc, lens, k, v, None, True, None,
                                             (-1, -1), 0.0, None, 3, False, cfg)
        outs.append((cfg, out, lse))
    assert len(outs) >= 2
    O_ref, L_ref = reference.attention_kvcache_naive(
        *(cp.asnumpy(x).astype(np.float64) for x in (q, kc0, vc0)), np.array(lens),
        k=cp.asnumpy(k).astype(np.float64), v=cp.asnumpy(v).astype(np.float64), causal=True)
    kc_after, vc_after = reference.kvcache_append(cp.asnumpy(kc0), cp.asnumpy(vc0),
                                                  np.array(lens), cp.asnumpy(k), cp.asnumpy(v))
    naive = np.stack([reference.attention_naive_same_dtype(
        cp.asnumpy(q)[b:b + 1], kc_after[b:b + 1, :lens[b] + 2], vc_after[b:b + 1, :lens[b] + 2],
        True)[0] for b in range(3)])
    for cfg, out, lse in outs:
        assert_accurate(cp, out, cp.asarray(naive), cp.asarray(O_ref), 2.0, f"out {cfg}")
        assert_lse(cp, lse, cp.asarray(L_ref))


def test_decode_empty_caches_see_nothing():
    """Entries with no keys: out = 0, lse = -inf (and the others unaffected)."""
    out, lse = run_decode([0, 0, 40], 8, 2, 64, DTYPES["bf16"])
    assert not bool(out[:2].astype(cp.float32).any())
    assert bool(cp.isneginf(lse[:2]).all())


def test_decode_device_lengths_and_table():
    run_decode([9, 1500], 8, 2, 128, DTYPES["bf16"], page=16, device_lens=True, seqlen_new=1)


def test_decode_checks_its_inputs():
    dt = DTYPES["bf16"]
    q = rand(cp, (2, 1, 8, 64), dt)
    kc = rand(cp, (2, 32, 2, 64), dt)
    with pytest.raises(ValueError, match="capacity"):
        cuflash.forward_kvcache(q, kc, kc.copy(), [30, 33])
    with pytest.raises(ValueError, match="capacity"):
        cuflash.forward_kvcache(q, kc, kc.copy(), cp.asarray([3, 40], dtype=cp.int32),
                                check_inputs=True)
    with pytest.raises(ValueError, match="pages outside"):
        cuflash.forward_kvcache(q, kc, kc.copy(), [3, 20], block_table=[[0, 1], [2, 9]])
    with pytest.raises(ValueError, match="multiple of the cache"):
        cuflash.forward_kvcache(rand(cp, (2, 1, 3, 64), dt), kc, kc.copy(), [1, 1])
    with pytest.raises(ValueError, match="multiples of 8"):
        cuflash.forward_kvcache(rand(cp, (2, 1, 8, 60), dt), rand(cp, (2, 32, 2, 60), dt),
                                rand(cp, (2, 32, 2, 60), dt), [1, 1])
    with pytest.raises(TypeError, match="same dtype"):
        cuflash.forward_kvcache(q, kc, rand(cp, kc.shape, np.float16), [1, 1])
    with pytest.raises(ValueError, match="both k and v"):
        cuflash.forward_kvcache(q, kc, kc.copy(), [1, 1], k=rand(cp, (2, 1, 2, 64), dt))


def test_dependent_launches_equal_ordinary_ones():
    """The split attention and the combine launched as programmatic dependents (sm_90+: each
    may start before the kernel before it has finished, and waits for its writes) give, call
    after call, bitwise the results of ordinary launches: 30 decode steps back to back, each
    with its own query and 384 new keys appended to a short cache (so the append runs long and
    the split attention reads its rows in its first column blocks), lengths on the GPU (the
    repeat path after the first step). A kernel reading before its wait would see the cache
    without this step's rows or the previous step's partials."""
    from cuflash import _loader
    major = cp.cuda.Device().compute_capability[:-1]
    if int(major) < 9 or _loader._launch_kernel_ex() is None:
        pytest.skip("dependent launches need compute capability 9.0+ and cuLaunchKernelEx")
    dt = DTYPES["bf16"]
    lens = cp.asarray([0, 5, 40, 0, 17, 3, 0, 9], dtype=cp.int32)
    kc0, vc0 = rand(cp, (8, 512, 8, 128), dt), rand(cp, (8, 512, 8, 128), dt)
    steps = [(rand(cp, (8, 1, 32, 128), dt), rand(cp, (8, 384, 8, 128), dt),
              rand(cp, (8, 384, 8, 128), dt)) for _ in range(30)]

    def run(dependent):
        _loader.DEPENDENT_LAUNCHES = dependent
        try:
            kc, vc = kc0.copy(), vc0.copy()
            outs = [cuflash.forward_kvcache(q, kc, vc, lens, k=k, v=v, num_splits=6)
                    for q, k, v in steps]
            cp.cuda.Device().synchronize()
            return outs, kc, vc
        finally:
            _loader.DEPENDENT_LAUNCHES = True
    (outs, kc, vc), (ref_outs, ref_kc, ref_vc) = run(True), run(False)
    assert cp.array_equal(kc, ref_kc) and cp.array_equal(vc, ref_vc)
    for (o, l), (ro, rl) in zip(outs, ref_outs, strict=True):
        assert cp.array_equal(o, ro) and cp.array_equal(l, rl)
    assert not all(cp.array_equal(outs[0][0], o) for o, _ in outs[1:])  # (steps differ)
