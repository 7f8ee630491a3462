"""CPU: cuflash.jax's CUDA callbacks (_gpu_forward, _gpu_backward, the varlen and KV-cache
ones) with stand-ins for XLA's device buffers and for the cuflash calls they make.

On a GPU the callbacks receive XLA's buffers (objects with __cuda_array_interface__ and a
void dtype for bfloat16) and call cuflash on CuPy views of them. Here real CuPy views are
built over fake addresses (no CUDA call is needed for that), and the cuflash functions are
replaced by recorders, so that each test checks what a GPU run would hand to cuflash: which
buffer goes where (by address), the shapes with vmap's leading axes folded into the batch,
the dtypes, and every option. Skipped without JAX or CuPy."""

import contextlib
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'cuflash[jax]')")
jnp = pytest.importorskip("jax.numpy")
cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
cjax = pytest.importorskip("cuflash.jax")

from cuflash import _api, _kvcache  # noqa: E402

BF16 = jnp.dtype(jnp.bfloat16)


class Buffer:
    """What XLA hands a GPU buffer callback: shape, a dtype (bfloat16 arrives as void) and the
    CUDA array interface, at a fake address."""
    _next = [1 << 36]

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        dt = np.dtype(dtype)
        self.dtype = np.dtype("V2") if dt == BF16 else dt
        self.ptr = Buffer._next[0]
        Buffer._next[0] += (math.prod(self.shape) * dt.itemsize + 1023) // 512 * 512 + 512

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "shape": self.shape, "version": 3}


class Ctx:
    stream = 12345


@pytest.fixture
def calls(monkeypatch):
    """Records each cuflash call the callbacks make: (name, args, kwargs)."""
    got = []

    def recorder(name):
        return lambda *a, **kw: got.append((name, a, kw))
    monkeypatch.setattr(cjax, "_stream", lambda cp, ptr, bufs: (contextlib.nullcontext(), 0))
    monkeypatch.setattr(_api, "_on_device", lambda cp, dev: contextlib.nullcontext())
    monkeypatch.setattr(_api, "_cupy", lambda: cupy)
    for name in ("forward", "_backward", "forward_varlen", "backward_varlen"):
        monkeypatch.setattr(_api, name, recorder(name))
    monkeypatch.setattr(_kvcache, "forward_kvcache", recorder("forward_kvcache"))
    return got


def _opts(**kw):
    base = dict(causal=True, scale=0.125, window_size=(7, 0), softcap=5.0, deterministic=True,
                dtype="bfloat16", algorithm="fa2")
    base.update(kw)
    return cjax._Options(**base)


def _is_view(x, buf, shape, dtype):
    assert isinstance(x, cupy.ndarray)
    assert x.data.ptr == buf.ptr, "not the buffer's own memory"
    assert x.shape == shape and x.dtype == np.dtype(dtype) and x.flags.c_contiguous


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)], ids=["plain", "vmap", "vmap x2"])
def test_forward_callback_views_xla_buffers_and_passes_every_option(calls, lead):
    q, k, v = Buffer(lead + (2, 40, 4, 64), BF16), Buffer(lead + (2, 50, 2, 64), BF16), \
        Buffer(lead + (2, 50, 2, 64), BF16)
    out, lse, slopes = Buffer(lead + (2, 40, 4, 64), BF16), \
        Buffer(lead + (2, 4, 40), np.float32), Buffer(lead + (2, 4), np.float32)
    b = math.prod(lead) * 2
    cjax._gpu_forward(_opts(algorithm="fa1"), {}, Ctx(), (out, lse), q, k, v, slopes)
    ((name, a, kw),) = calls
    assert name == "forward"
    for x, buf, shape in zip(a, (q, k, v), ((b, 40, 4, 64), (b, 50, 2, 64), (b, 50, 2, 64))):
        _is_view(x, buf, shape, BF16)
    _is_view(kw["out"], out, (b, 40, 4, 64), BF16)
    _is_view(kw["lse"], lse, (b, 4, 40), np.float32)
    _is_view(kw["alibi_slopes"], slopes, (b, 4), np.float32)
    assert (kw["causal"], kw["softmax_scale"], kw["window_size"], kw["softcap"],
            kw["algorithm"]) == (True, 0.125, (7, 0), 5.0, "fa1")


def test_backward_callback_carves_its_scratch_from_xla(calls):
    lead = (3,)
    shp_q, shp_k = lead + (2, 40, 4, 64), lead + (2, 50, 2, 64)
    dout, q, out = (Buffer(shp_q, np.float16) for _ in range(3))
    k, v = Buffer(shp_k, np.float16), Buffer(shp_k, np.float16)
    lse = Buffer(lead + (2, 4, 40), np.float32)
    dq, dk, dv = Buffer(shp_q, np.float16), Buffer(shp_k, np.float16), Buffer(shp_k, np.float16)
    scratch = Buffer(lead + (4096,), np.uint8)
    cjax._gpu_backward(_opts(dtype="float16"), Ctx(), (dq, dk, dv, scratch), dout, q, k, v,
                       out, lse, None)
    ((name, a, kw),) = calls
    assert name == "_backward"
    dO, Q, K, V, O, L, causal, scale, det, dQ, dK, dV, config, window, cap, sl = a
    for x, buf, shape in ((dO, dout, (6, 40, 4, 64)), (Q, q, (6, 40, 4, 64)),
                          (K, k, (6, 50, 2, 64)), (V, v, (6, 50, 2, 64)),
                          (O, out, (6, 40, 4, 64)), (dQ, dq, (6, 40, 4, 64)),
                          (dK, dk, (6, 50, 2, 64)), (dV, dv, (6, 50, 2, 64))):
        _is_view(x, buf, shape, np.float16)
    _is_view(L, lse, (6, 4, 40), np.float32)
    _is_view(kw["scratch"], scratch, (3 * 4096,), np.uint8)
    assert (causal, scale, det, config, window, cap, sl) == \
        (True, 0.125, True, None, (7, 0), 5.0, None)


def test_varlen_callbacks_pass_the_cu_seqlens_and_the_longest_lengths(calls):
    opts = _opts(deterministic=False, packed=(70, 90))
    q, out, dout = (Buffer((100, 4, 32), BF16) for _ in range(3))
    k, v = Buffer((120, 2, 32), BF16), Buffer((120, 2, 32), BF16)
    lse = Buffer((4, 100), np.float32)
    cu_q, cu_k = Buffer((4,), np.int32), Buffer((4,), np.int32)
    cjax._gpu_forward_varlen(opts, Ctx(), (out, lse), q, k, v, None, cu_q, cu_k)
    dq, dk, dv = Buffer((100, 4, 32), BF16), Buffer((120, 2, 32), BF16), \
        Buffer((120, 2, 32), BF16)
    cjax._gpu_backward_varlen(opts, Ctx(), (dq, dk, dv), dout, q, k, v, out, lse, None, cu_q,
                              cu_k)
    (f, fa, fkw), (b, ba, bkw) = calls
    assert (f, b) == ("forward_varlen", "backward_varlen")
    _is_view(fa[0], q, (100, 4, 32), BF16)
    _is_view(fa[3], cu_q, (4,), np.int32)
    _is_view(fa[4], cu_k, (4,), np.int32)
    assert fa[5:] == (70, 90)
    _is_view(fkw["out"], out, (100, 4, 32), BF16)
    _is_view(fkw["lse"], lse, (4, 100), np.float32)
    _is_view(ba[5], lse, (4, 100), np.float32)
    _is_view(ba[6], cu_q, (4,), np.int32)
    assert ba[8:] == (70, 90) and bkw["deterministic"] is False
    for x, buf in ((bkw["dq"], dq), (bkw["dk"], dk), (bkw["dv"], dv)):
        _is_view(x, buf, buf.shape, BF16)


@pytest.mark.parametrize("append", [False, True])
def test_decode_callback_writes_the_output_caches(calls, append):
    """With an append the caches passed to forward_kvcache are the output buffers (XLA's
    aliases of the inputs), so that the new keys land in what the step returns."""
    opts = _opts(deterministic=False, decode=3)
    q, out = Buffer((2, 1, 8, 64), BF16), Buffer((2, 1, 8, 64), BF16)
    kc, vc = Buffer((10, 16, 2, 64), BF16), Buffer((10, 16, 2, 64), BF16)
    lse = Buffer((2, 8, 1), np.float32)
    lens, table = Buffer((2,), np.int32), Buffer((2, 5), np.int32)
    k = v = None
    outputs = (out, lse)
    if append:
        k, v = Buffer((2, 1, 2, 64), BF16), Buffer((2, 1, 2, 64), BF16)
        outputs += (Buffer(kc.shape, BF16), Buffer(vc.shape, BF16))
    cjax._gpu_decode(opts, Ctx(), outputs, q, kc, vc, lens, k, v, table, None)
    ((name, a, kw),) = calls
    assert name == "forward_kvcache"
    _is_view(a[0], q, q.shape, BF16)
    caches = outputs[2:] if append else (kc, vc)
    _is_view(a[1], caches[0], kc.shape, BF16)
    _is_view(a[2], caches[1], vc.shape, BF16)
    _is_view(a[3], lens, (2,), np.int32)
    _is_view(kw["block_table"], table, (2, 5), np.int32)
    _is_view(kw["out"], out, out.shape, BF16)
    _is_view(kw["lse"], lse, (2, 8, 1), np.float32)
    assert kw["num_splits"] == 3 and (kw["k"] is None) == (not append)
    if append:
        _is_view(kw["k"], k, k.shape, BF16)


@pytest.fixture
def views(monkeypatch):
    """cuflash.jax's kept views, emptied for the test."""
    kept = {}
    monkeypatch.setattr(cjax, "_views", kept)
    return kept


def test_views_are_kept_by_address_shape_dtype_and_device(views):
    """A buffer at an address seen before, with the same shape, dtype, folding and device, gets
    the view made then (no CuPy constructors on the call's path); anything else gets its own,
    over its own address."""
    a, b = Buffer((2, 40, 4, 64), BF16), Buffer((2, 40, 4, 64), BF16)
    x = cjax._view(cupy, a, "bfloat16", 4, 0)
    _is_view(x, a, a.shape, BF16)
    again = Buffer(a.shape, BF16)  # (XLA's buffer object is new on every call)
    again.ptr = a.ptr
    assert cjax._view(cupy, again, "bfloat16", 4, 0) is x
    y = cjax._view(cupy, b, "bfloat16", 4, 0)
    _is_view(y, b, b.shape, BF16)
    assert y is not x
    other = {"dtype": cjax._view(cupy, a, "float16", 4, 0),
             "device": cjax._view(cupy, a, "bfloat16", 4, 1),
             "fold": cjax._view(cupy, a, "bfloat16", 3, 0)}
    assert len({id(v) for v in (x, *other.values())}) == 4
    assert other["dtype"].dtype == np.float16 and other["device"].data.device_id == 1
    assert other["fold"].shape == (80, 4, 64) and other["fold"].data.ptr == a.ptr
    small = Buffer((1, 40, 4, 64), BF16)
    small.ptr = a.ptr  # (the same address, another shape: the view of this one)
    assert cjax._view(cupy, small, "bfloat16", 4, 0).shape == small.shape
    assert cjax._view(cupy, None, "bfloat16", 4, 0) is None


def test_kept_views_are_bounded_and_hold_no_xla_buffer(views):
    """A stream of new addresses does not grow the views without bound, and a kept view
    keeps no reference to XLA's buffer object (valid during its callback only)."""
    import gc
    import weakref

    buf = Buffer((4, 8), np.float32)
    gone = weakref.ref(buf)
    x = cjax._view(cupy, buf, "float32", 2, 0)
    del buf
    gc.collect()
    assert gone() is None and x.data.ptr
    for _ in range(1500):
        cjax._view(cupy, Buffer((4, 8), np.float32), "float32", 2, 0)
    assert 0 < len(views) <= 1024


def test_callbacks_hand_cuflash_the_same_views_on_the_same_buffers(calls, views):
    """Two calls of a jitted step on the same addresses give cuflash the same arrays, so that
    its repeat path sees the same addresses (and what it keeps by them) again."""
    q, k, v = Buffer((2, 40, 4, 64), BF16), Buffer((2, 50, 2, 64), BF16), \
        Buffer((2, 50, 2, 64), BF16)
    out, lse = Buffer((2, 40, 4, 64), BF16), Buffer((2, 4, 40), np.float32)
    for _ in range(2):
        cjax._gpu_forward(_opts(), {}, Ctx(), (out, lse), q, k, v, None)
    (_, a1, kw1), (_, a2, kw2) = calls
    assert all(x is y for x, y in zip(a1, a2))
    assert kw1["out"] is kw2["out"] and kw1["lse"] is kw2["lse"]
    q2 = Buffer(q.shape, BF16)  # a new address: a new view over it
    cjax._gpu_forward(_opts(), {}, Ctx(), (out, lse), q2, k, v, None)
    assert calls[-1][1][0] is not a1[0] and calls[-1][1][0].data.ptr == q2.ptr


class _Launch:
    """A stand-in for the forward's kept launch (_api._Repeat): records its replays."""

    def __init__(self, current=True):
        self.current, self.replays = current, []

    def replay(self, filled, stream):
        if self.current:
            self.replays.append((filled, stream))
        return self.current


def test_forward_callback_replays_the_kept_launch_on_the_same_addresses(calls, views,
                                                                        monkeypatch):
    """Once forward keeps a launch for a set of addresses, the callback launches its bytes on
    XLA's stream without calling forward; new addresses or shapes, another stream, ALiBi or a
    thread with another GPU's context current go through forward again."""
    launch, asked = _Launch(), []

    def kept_forward(q, k, v, out, lse, causal, scale, window, softcap, algorithm):
        asked.append((q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, lse.data.ptr,
                      causal, scale, window, softcap, algorithm))
        return (launch, b"bytes %d" % len(asked))
    monkeypatch.setattr(_api, "_kept_forward", kept_forward)
    q, k, v = Buffer((2, 40, 4, 64), BF16), Buffer((2, 50, 2, 64), BF16), \
        Buffer((2, 50, 2, 64), BF16)
    out, lse = Buffer((2, 40, 4, 64), BF16), Buffer((2, 4, 40), np.float32)
    kept, opts = {}, _opts()
    cjax._gpu_forward(opts, kept, Ctx(), (out, lse), q, k, v, None)
    assert [c[0] for c in calls] == ["forward"] and not launch.replays
    assert asked == [(q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr, True, 0.125, (7, 0), 5.0, "fa2")]
    for _ in range(3):  # the same addresses: the kept bytes, on XLA's stream
        cjax._gpu_forward(opts, kept, Ctx(), (out, lse), q, k, v, None)
    assert len(calls) == 1 and launch.replays == [(b"bytes 1", Ctx.stream)] * 3
    k2 = Buffer(k.shape, BF16)  # a new address
    cjax._gpu_forward(opts, kept, Ctx(), (out, lse), q, k2, v, None)
    assert len(calls) == 2 and asked[-1][1] == k2.ptr

    class Other(Ctx):
        stream = 777
    cjax._gpu_forward(opts, kept, Other(), (out, lse), q, k, v, None)  # another stream
    assert len(calls) == 3 and len(launch.replays) == 3
    cjax._gpu_forward(opts, kept, Other(), (out, lse), q, k, v, None)
    assert len(calls) == 3 and launch.replays[-1] == (b"bytes 3", 777)
    k3, v3 = Buffer((2, 60, 2, 64), BF16), Buffer((2, 60, 2, 64), BF16)
    k3.ptr, v3.ptr = k.ptr, v.ptr  # the same addresses with other shapes: another call
    cjax._gpu_forward(opts, kept, Ctx(), (out, lse), q, k3, v3, None)
    assert len(calls) == 4
    slopes = Buffer((2, 4), np.float32)  # ALiBi: forward every time (it keeps no launch)
    n = len(asked)
    for _ in range(2):
        cjax._gpu_forward(opts, kept, Ctx(), (out, lse), q, k, v, slopes)
    assert len(calls) == 6 and len(asked) == n
    launch.current = False  # another GPU's context current: forward, which switches to it
    cjax._gpu_forward(opts, kept, Ctx(), (out, lse), q, k, v, None)
    assert len(calls) == 7 and len(launch.replays) == 4


def test_forward_callback_keeps_nothing_that_forward_does_not(calls, views, monkeypatch):
    """Where forward keeps no launch (yet) for the call, every call goes through forward."""
    monkeypatch.setattr(_api, "_kept_forward", lambda *a: None)
    q, k, v = Buffer((2, 40, 4, 64), BF16), Buffer((2, 50, 2, 64), BF16), \
        Buffer((2, 50, 2, 64), BF16)
    out, lse = Buffer((2, 40, 4, 64), BF16), Buffer((2, 4, 40), np.float32)
    kept = {}
    for _ in range(3):
        cjax._gpu_forward(_opts(), kept, Ctx(), (out, lse), q, k, v, None)
    assert len(calls) == 3 and not kept
