"""GPU: the hardening cases (issue 15). Each of these gave a wrong answer, a crash or a poisoned
CUDA context before; each must now give the right answer or a clear exception.

* rows that see no key (causal, seqlen_q much larger than seqlen_k): out = 0, lse = -inf in
  every kernel family, at every head-dim bucket, forward and backward, batch 8 x 9 heads;
* misaligned and overlapping preallocated outputs;
* the first launch from a fresh host thread after precompile();
* NaN in q or k: NaN in out and lse;
* an out-of-range softmax_scale;
* an unusable kernel cache directory;
* bounded scratch memory (deterministic dQ slices, GQA without per-query-head copies);
* the VJP closure called on another stream than the forward's;
* host threads on their own streams, and a problem of more than 2^31 elements (slow).
"""

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from gpu_helpers import assert_accurate, assert_lse, poisoned, rand

from cuflash import _api, _loader, _plan, _registry, reference

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy", reason="CuPy not installed")

import cuflash  # noqa: E402

DTYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", autouse=True)
def warm_kernels():
    cuflash.precompile(fa1=True)


def _qkv(b, sq, sk, h, hk, d, dtype, scale=1.0):
    return (rand(cp, (b, sq, h, d), dtype, scale), rand(cp, (b, sk, hk, d), dtype, scale),
            rand(cp, (b, sk, hk, d), dtype, scale))


# ---- 0. rows that see no key ------------------------------------------------------------------
# (seqlen_q, seqlen_k) with the first seqlen_q - seqlen_k rows seeing no key under the causal
# mask, batch 8 x 9 heads (FlashAttention-2's test size: a defect that hits one row in a
# thousand hides in a batch of 2 x 6). Each head-dim bucket, both dtypes.
NO_KEY_SHAPES = [(799, 3), (239, 1), (513, 127), (20000, 16)]


def _check_masked_forward(q, k, v, algorithm):
    b, sq, h, d = q.shape
    sk = k.shape[1]
    O_ref, L_ref = reference.attention_naive(q, k, v, True)
    naive = reference.attention_naive_same_dtype(q, k, v, True)
    for _ in range(3):  # the defect struck a few rows at random: repeat on fresh poison
        out = poisoned(cp, q.shape, q.dtype)
        lse = poisoned(cp, (b, h, sq), cp.float32)
        cuflash.forward(q, k, v, causal=True, out=out, lse=lse, algorithm=algorithm)
        blind = sq - sk  # rows 0 .. blind - 1 see no key
        assert bool((out[:, :blind] == 0).all()), "a row that sees no key is not 0"
        assert bool(cp.isneginf(lse[:, :, :blind]).all()), "its lse is not -inf"
        assert_accurate(cp, out, naive, O_ref, 2.0, "out")
        assert_lse(cp, lse, L_ref)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("d", _plan.HEAD_DIM_BUCKETS)
@pytest.mark.parametrize("sq,sk", NO_KEY_SHAPES, ids=str)
def test_rows_that_see_no_key_forward(sq, sk, d, dt):
    b = 8 if sq < 20000 else 2  # (20000 x 9 heads x 8 is a lot of float64 reference)
    _check_masked_forward(*_qkv(b, sq, sk, 9, 9, d, DTYPES[dt]), "fa2")


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq,sk", NO_KEY_SHAPES[:3], ids=str)
def test_rows_that_see_no_key_fa1(sq, sk, d):
    _check_masked_forward(*_qkv(8, sq, sk, 9, 3, d, ml_dtypes.bfloat16), "fa1")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("d", _plan.HEAD_DIM_BUCKETS)
@pytest.mark.parametrize("sq,sk", NO_KEY_SHAPES[:3], ids=str)
def test_rows_that_see_no_key_backward(sq, sk, d, dt):
    q, k, v = _qkv(8, sq, sk, 9, 3, d, DTYPES[dt])
    dout = rand(cp, q.shape, q.dtype)
    out, lse = cuflash.forward(q, k, v, causal=True)
    dq, dk, dv = (poisoned(cp, x.shape, x.dtype) for x in (q, k, v))
    cuflash.backward(dout, q, k, v, out, lse, causal=True, dq=dq, dk=dk, dv=dv)
    assert bool((dq[:, :sq - sk] == 0).all())
    exact = reference.attention_backward_naive(dout, q, k, v, True)
    naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, True)
    for name, ours, nv, ex in zip(("dq", "dk", "dv"), (dq, dk, dv), naive, exact):
        assert_accurate(cp, ours, nv, ex, 3.0, name)


# ---- 1, 2. preallocated outputs: alignment and overlap ------------------------------------------

def _misaligned(shape, dtype):
    """A C-contiguous view of `shape` that starts 2 bytes past a 16-byte boundary."""
    n = int(np.prod(shape))
    flat = cp.empty(n + 8, dtype=dtype)
    view = flat[1:n + 1].reshape(shape)
    assert view.flags.c_contiguous and view.data.ptr % 16 != 0
    return view


def test_misaligned_outputs_are_refused_and_the_context_survives():
    q, k, v = _qkv(2, 64, 64, 4, 4, 64, np.float16)
    dout = rand(cp, q.shape, q.dtype)
    out, lse = cuflash.forward(q, k, v)
    for name in ("dq", "dk", "dv"):
        like = {"dq": q, "dk": k, "dv": v}[name]
        with pytest.raises(ValueError, match=f"{name} must start on a 16-byte boundary"):
            cuflash.backward(dout, q, k, v, out, lse, **{name: _misaligned(like.shape, q.dtype)})
    with pytest.raises(ValueError, match="out must start on a 16-byte boundary"):
        cuflash.forward(q, k, v, out=_misaligned(q.shape, q.dtype))
    lse_bad = cp.empty(2 * 4 * 64 * 4 + 4, dtype=cp.uint8)[2:2 + 2 * 4 * 64 * 4].view(
        cp.float32).reshape(2, 4, 64)
    with pytest.raises(ValueError, match="lse must start on a 4-byte boundary"):
        cuflash.forward(q, k, v, lse=lse_bad)
    cp.cuda.Device().synchronize()  # the context is still usable
    again, _ = cuflash.forward(q, k, v)
    assert bool((again == out).all())


def test_outputs_that_overlap_inputs_are_refused():
    q, k, v = _qkv(1, 256, 256, 4, 4, 64, np.float16)
    dout = rand(cp, q.shape, q.dtype)
    v2 = v.copy()
    with pytest.raises(ValueError, match="out shares memory with v"):
        cuflash.forward(q, k, v2, out=v2)
    with pytest.raises(ValueError, match="out shares memory with q"):
        cuflash.forward(q, k, v, out=q)
    out, lse = cuflash.forward(q, k, v)
    b = cp.empty_like(q)
    with pytest.raises(ValueError, match="dq shares memory with dk"):
        cuflash.backward(dout, q, k, v, out, lse, dq=b, dk=b)
    with pytest.raises(ValueError, match="dk shares memory with k"):
        cuflash.backward(dout, q, k, v, out, lse, dk=k)
    with pytest.raises(ValueError, match="dq shares memory with dout"):
        cuflash.backward(dout, q, k, v, out, lse, dq=dout)
    # A view into the same buffer that touches no byte of the others is fine.
    buf = cp.empty((2,) + q.shape, q.dtype)
    dq, dk, dv = cuflash.backward(dout, q, k, v, out, lse, dq=buf[0], dk=buf[1])
    ref = cuflash.backward(dout, q, k, v, out, lse)
    assert all(bool((a == r).all()) for a, r in zip((dq, dk, dv), ref))


# ---- 3. a fresh host thread after precompile() ------------------------------------------------

def test_first_launch_from_a_fresh_thread_after_precompile():
    """precompile() loads every kernel in worker threads; the first launch then happens in a
    thread that has made no CUDA call (its launcher is built there). It used to fail with
    CUDA_ERROR_INVALID_CONTEXT. A new process, so that no launcher exists yet."""
    code = textwrap.dedent("""
        import threading, cupy as cp, numpy as np, cuflash
        q = cp.random.standard_normal((1, 128, 2, 64), dtype=cp.float32).astype(np.float16)
        cuflash.precompile(dtypes=("float16",), head_dims=[64], causal=(True,))
        # A pool block for every allocation the worker makes, so that it makes no CUDA call
        # (which would bind the context) before its first launch.
        spare = cp.empty(64 << 20, dtype=cp.uint8)
        del spare
        results = []
        def worker():
            out, lse = cuflash.forward(q, q, q, causal=True)
            dq, dk, dv = cuflash.backward(q, q, q, q, out, lse, causal=True)
            cp.cuda.get_current_stream().synchronize()
            results.append(float(abs(out.astype(cp.float32)).sum()))
        t = threading.Thread(target=worker)
        t.start(); t.join()
        assert results and np.isfinite(results[0]), results
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


# ---- 4. NaN in, NaN out -------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["fa2", "fa1"])
@pytest.mark.parametrize("d", [64, 128])
def test_nan_gives_nan_in_out_and_lse(algorithm, d):
    q, k, v = _qkv(2, 300, 300, 4, 4, d, np.float16)
    q[0, 5, 1, 3] = np.nan          # row 5 of head 1, batch 0
    k[1, 200, 2, 0] = np.nan        # key 200 of head 2, batch 1: every row that sees it
    for causal in (False, True):
        out, lse = cuflash.forward(q, k, v, causal=causal, algorithm=algorithm)
        assert bool(cp.isnan(out[0, 5, 1]).all()) and bool(cp.isnan(lse[0, 1, 5]))
        seen = slice(200, None) if causal else slice(None)
        assert bool(cp.isnan(lse[1, 2, seen]).all()) and bool(cp.isnan(out[1, seen, 2]).all())
        if causal:  # rows before 200 do not see the NaN key
            assert bool(cp.isfinite(lse[1, 2, :200]).all())
        clean = cp.ones(lse.shape, bool)
        clean[0, 1, 5] = False
        clean[1, 2, seen] = False
        assert bool(cp.isfinite(lse[clean]).all())
        assert not bool(cp.isneginf(lse).any())


# ---- 5. softmax_scale ---------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["fa2", "fa1"])
def test_huge_softmax_scale_is_a_clear_error(algorithm):
    q, k, v = _qkv(1, 16, 16, 2, 2, 64, np.float16)
    with pytest.raises(ValueError, match="softmax_scale.*3e\\+38"):
        cuflash.forward(q, k, v, softmax_scale=3e38, algorithm=algorithm)


# ---- 8. an unusable kernel cache directory ------------------------------------------------------

def test_unusable_cache_dir_falls_back_to_memory(monkeypatch):
    """CuPy's disk cache refuses to save (a read-only CUPY_CACHE_DIR): cuflash's kernel
    compiles anyway, is kept in memory, and one warning says so. (CuPy's own kernels would
    fail the same way: the inputs and the reference are computed before the cache breaks.)"""
    import uuid
    import warnings

    compiler = pytest.importorskip("cupy.cuda.compiler")

    class ReadOnly:
        def load(self, name):
            return None

        def save(self, name, cubin, source):
            raise PermissionError(13, "Permission denied", "/read-only/kernel_cache")

    q, k, v = _qkv(1, 100, 100, 2, 2, 96, ml_dtypes.bfloat16)
    O_ref, _ = reference.attention_naive(q, k, v, True)
    naive = reference.attention_naive_same_dtype(q, k, v, True)
    with monkeypatch.context() as m:
        m.setattr(compiler, "_kernel_cache_backend", ReadOnly())
        # An option no other compile in this process used: CuPy also memoises modules in
        # memory by source and options, and that would serve the kernel without compiling.
        unique = f"-DCUFLASH_CACHE_TEST={uuid.uuid4().int % 10**9}"
        m.setattr(_loader, "NVRTC_OPTIONS", _loader.NVRTC_OPTIONS + (unique,))
        m.setattr(_loader, "_cache", {})
        m.setattr(_loader, "_disk_cache_failed", False)
        m.setattr(_api, "_forward_launches", {})
        m.setattr(_api, "_repeats", {})  # (no launch remembered from an earlier test either)
        with pytest.warns(RuntimeWarning, match="kernel cache directory cannot be used"):
            out, lse = cuflash.forward(q, k, v, causal=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once only
            cuflash.forward(q, k, v, causal=False)
        cp.cuda.Device().synchronize()
    assert_accurate(cp, out, naive, O_ref, 2.0, "out")


# ---- 9. scratch memory --------------------------------------------------------------------------

def _pool_peak(fn):
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    pool.free_all_blocks()
    base = pool.total_bytes()
    fn()
    cp.cuda.Device().synchronize()
    return pool.total_bytes() - base


def test_deterministic_atomics_scratch_is_bounded():
    """sm_80-89's deterministic mode (forced here through its tile): the float32 dQ slices
    stay within 2x the float32 dQ (it was 16 slices, 1 GiB, at this size)."""
    dev = cp.cuda.Device().id
    cfg = _plan.backward_config(128, _api._max_smem(cp, dev), bulk=False)
    q, k, v = _qkv(1, 32768, 32768, 4, 4, 128, ml_dtypes.bfloat16)
    dout = rand(cp, q.shape, q.dtype)
    out, lse = cuflash.forward(q, k, v, causal=True)
    dq_f32 = q.size * 4
    peak = _pool_peak(lambda: _api._backward(dout, q, k, v, out, lse, True, None, True,
                                             None, None, None, cfg))
    # dq, dk, dv (3 x 32 MiB) + D + at most 2 float32 dQ slices
    assert peak <= 3 * q.nbytes + 2 * dq_f32 + (8 << 20), peak / 2**20


def test_gqa_backward_keeps_no_per_query_head_copies():
    """32 query heads on 8 kv heads: dK, dV are summed over each group in the kernel, so the
    backward allocates no float32 dK/dV per query head (that was 2 x 4 x the size of k in
    float32 here)."""
    q, k, v = _qkv(4, 4096, 4096, 32, 8, 128, ml_dtypes.bfloat16)
    dout = rand(cp, q.shape, q.dtype)
    out, lse = cuflash.forward(q, k, v)
    cuflash.backward(dout, q, k, v, out, lse)  # (the split tail's buffers, kept per stream)
    peak = _pool_peak(lambda: cuflash.backward(dout, q, k, v, out, lse))
    dq_accum = q.size * 4
    assert peak <= q.nbytes + 2 * k.nbytes + dq_accum + (8 << 20), peak / 2**20


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("b,sk,h,hk", [(4, 4096, 8, 2), (1, 130, 8, 1), (2, 700, 6, 2)])
def test_gqa_backward_both_ways(b, sk, h, hk, deterministic):
    """Both GQA paths: one part per kv head (summed in registers) and, where that leaves SMs
    idle, float32 slices per part summed after the kernel; accurate, and the deterministic mode
    bitwise repeatable."""
    sms = _api._device_properties(cp, cp.cuda.Device().id)["multiProcessorCount"]
    q, k, v = _qkv(b, 333, sk, h, hk, 64, np.float16)
    dout = rand(cp, q.shape, q.dtype)
    for causal in (False, True):
        out, lse = cuflash.forward(q, k, v, causal=causal)
        first = cuflash.backward(dout, q, k, v, out, lse, causal=causal,
                                 deterministic=deterministic)
        exact = reference.attention_backward_naive(dout, q, k, v, causal)
        naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, causal)
        for name, ours, nv, ex in zip(("dq", "dk", "dv"), first, naive, exact):
            assert_accurate(cp, ours, nv, ex, 3.0, name)
        if deterministic:
            again = cuflash.backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
            assert all(bool((a == x).all()) for a, x in zip(first, again))
    T_c = -(-sk // _plan.backward_config(64, _api._max_smem(cp, 0), True).B_c)
    parts = _registry.head_parts(h // hk, T_c * hk * b, sms)
    assert parts == (1 if sk == 4096 else h // hk)  # (both paths are exercised)


# ---- 10. the VJP closure on another stream ------------------------------------------------------

_SPIN = None


def _spin(ms):
    """Keep the current stream busy for about `ms` milliseconds."""
    global _SPIN
    if _SPIN is None:
        _SPIN = cp.RawKernel(r'''
        extern "C" __global__ void spin(long long ns) {
            long long t0 = clock64();
            while (clock64() - t0 < ns) { }
        }''', "spin")
    clock_khz = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["clockRate"]
    _SPIN((1,), (1,), (np.int64(ms * clock_khz),))


def test_vjp_on_another_stream_waits_for_the_forward():
    q, k, v = _qkv(2, 1024, 1024, 8, 8, 128, ml_dtypes.bfloat16)
    dout = rand(cp, q.shape, q.dtype)
    expect_out, expect_lse = cuflash.forward(q, k, v, causal=True)
    expect = cuflash.backward(dout, q, k, v, expect_out, expect_lse, causal=True)
    cp.cuda.Device().synchronize()  # (inputs written on the default stream)
    fwd_stream, bwd_stream = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with fwd_stream:
        # Leave NaN in the pool blocks (of this stream) that out and lse will reuse.
        junk = [cp.full(q.shape, np.nan, q.dtype), cp.full(expect_lse.shape, np.nan, cp.float32)]
        del junk
        _spin(200)  # the forward waits behind this
        out, vjp = cuflash.attention_with_vjp(q, k, v, causal=True)
    with bwd_stream:
        got = vjp(dout)
    bwd_stream.synchronize()
    fwd_stream.synchronize()
    assert bool((out == expect_out).all())
    for a, b in zip(got, expect):
        assert bool(cp.isfinite(a.astype(cp.float32)).all())
        rel = float(cp.abs(a.astype(cp.float32) - b.astype(cp.float32)).max() /
                    cp.abs(b.astype(cp.float32)).max())
        assert rel < 1e-2, rel


# ---- kept: host threads on their own streams; more than 2^31 elements --------------------------

def test_host_threads_on_their_own_streams_match_a_serial_run():
    """8 host threads, each on its own stream, forward + deterministic backward: bitwise equal
    to the same problems run one after the other."""
    problems = []
    for i in range(8):
        q, k, v = _qkv(1 + i % 2, 200 + 61 * i, 300 + 37 * i, 4, 2 if i % 2 else 4,
                       64 + 32 * (i % 3), np.float16 if i % 2 else ml_dtypes.bfloat16)
        problems.append((q, k, v, rand(cp, q.shape, q.dtype), bool(i % 3)))

    def run(p):
        q, k, v, dout, causal = p
        out, lse = cuflash.forward(q, k, v, causal=causal)
        grads = cuflash.backward(dout, q, k, v, out, lse, causal=causal, deterministic=True)
        return (out, lse) + tuple(grads)

    serial = [run(p) for p in problems]
    cp.cuda.Device().synchronize()
    results = [None] * 8

    def worker(i):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            for _ in range(3):
                results[i] = run(problems[i])
            stream.synchronize()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        for a, b in zip(results[i], serial[i]):
            assert bool((a == b).all()), f"thread {i} differs from the serial run"


@pytest.mark.slow
def test_more_than_2_31_elements():
    """b*s*h*d > 2^31: forward and deterministic backward of the last batch entry are bitwise
    equal to that entry computed alone (64-bit offsets everywhere)."""
    b, n, h, d = 1040, 2048, 16, 64
    assert b * n * h * d > 2**31
    q, k, v = _qkv(b, n, n, h, h, d, ml_dtypes.bfloat16)
    dout = rand(cp, q.shape, q.dtype)
    out, lse = cuflash.forward(q, k, v, causal=True)
    grads = cuflash.backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    last = slice(b - 1, b)
    out1, lse1 = cuflash.forward(q[last], k[last], v[last], causal=True)
    grads1 = cuflash.backward(dout[last], q[last], k[last], v[last], out1, lse1, causal=True,
                              deterministic=True)
    assert bool((out[last] == out1).all()) and bool((lse[last] == lse1).all())
    for a, a1 in zip(grads, grads1):
        assert bool((a[last] == a1).all())
