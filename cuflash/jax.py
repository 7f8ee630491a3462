"""cuflash inside JAX: jax.jit, jax.grad and jax.vmap run cuflash's kernels on XLA's own CUDA
stream, on XLA's buffers in place (zero copy), with no C++ extension to build.

    from cuflash.jax import flash_attention
    out = flash_attention(q, k, v, causal=True)   # (batch, seqlen, heads, d), bf16 or fp16

Each launch goes through ``jax.experimental.buffer_callback``: XLA hands the callback its
device buffers and its stream; the callback views the buffers as CuPy arrays (no copy) and
calls :func:`cuflash.forward` / :func:`cuflash.backward` on that stream, so nothing waits on
the host. The gradient is a ``jax.custom_vjp`` whose residuals are q, k, v, out and the
float32 log-sum-exp L (no N x N matrix), as in the FlashAttention-2 backward.

On a CPU backend the same function runs cuflash's NumPy reference (float64, slow: for tests and
debugging, never for speed). Optional module: it needs JAX (``pip install "cuflash[jax]"``);
the rest of cuflash never imports JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero
    from jax.experimental.buffer_callback import buffer_callback
except ImportError as exc:
    raise ImportError(f"cuflash.jax needs JAX 0.7 or newer (jax.experimental.buffer_callback): "
                      f'pip install "cuflash[jax]" ({exc})') from exc

from . import _api, _kvcache, reference

__all__ = ["flash_attention", "flash_attention_varlen", "flash_attention_kvcache"]


def flash_attention(q, k, v, causal: bool = False, softmax_scale: float | None = None, *,
                    window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                    deterministic: bool = False, return_lse: bool = False,
                    algorithm: str = "fa2", command_buffer: bool = False):
    """FlashAttention-2 on JAX arrays: ``out = softmax(softmax_scale * q k^T [+ mask]) v``.

    Parameters
    ----------
    q : jax.Array, (batch, seqlen_q, nheads, headdim), float16 or bfloat16
    k, v : jax.Array, (batch, seqlen_k, nheads_k, headdim), q's dtype; ``nheads % nheads_k
        == 0`` (GQA / MQA)
    causal, softmax_scale, window_size, softcap : as :func:`cuflash.forward` (static: plain
        Python values, fixed when the function is traced)
    alibi_slopes : jax.Array, float32, (nheads,) or (batch, nheads), optional. A constant of
        the computation: differentiating with respect to it raises (no gradient is computed
        for it).
    deterministic : bool, as :func:`cuflash.backward` (the gradient's dQ summed in a fixed order)
    return_lse : bool, also return L, float32 (batch, nheads, seqlen_q). L is not
        differentiable: a gradient that flows into it raises at trace time.
    algorithm : "fa2" (default) or "fa1", the forward's loop order (as :func:`cuflash.forward`;
        the gradient is FlashAttention-2's recompute backward either way)
    command_buffer : bool, let XLA capture the launches into its CUDA graphs
        (``command_buffer_compatible``): the Python callback then runs once per set of
        buffer addresses and XLA replays its launches. Nothing is allocated inside the
        callbacks either way (the backward's scratch is an XLA buffer). Experimental: see
        bench/jax_bench.py for what it saves.

    Returns ``out`` (q's shape and dtype), or ``(out, lse)``.

    Works under ``jax.jit``, ``jax.grad`` / ``jax.value_and_grad`` and ``jax.vmap`` (over
    leading axes: they are folded into the batch). Shapes, dtypes and options are checked at
    trace time, with the messages of the CuPy API (TypeError / ValueError).
    """
    q, k, v = (jnp.asarray(x) for x in (q, k, v))
    opts = _options(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes,
                    deterministic, algorithm)
    opts = dataclasses.replace(opts, command_buffer=_api._check_flag("command_buffer",
                                                                     command_buffer))
    slopes = None
    if alibi_slopes is not None:  # (batch, nheads): one row per batch entry, also under vmap
        slopes = jnp.broadcast_to(alibi_slopes, (q.shape[0], q.shape[2]))
    out, lse = _attention_jit(opts, q, k, v, slopes)
    return (out, lse) if return_lse else out


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                           max_seqlen_k: int, causal: bool = False,
                           softmax_scale: float | None = None, *, window_size=(-1, -1),
                           softcap: float = 0.0, alibi_slopes=None, deterministic: bool = False,
                           return_lse: bool = False):
    """FlashAttention-2 over a variable-length batch packed back to back (no padding), on JAX
    arrays: :func:`cuflash.forward_varlen` and its backward under ``jax.jit`` and
    ``jax.grad``.

    q : (total_q, nheads, headdim); k, v : (total_k, nheads_k, headdim), float16 or bfloat16
    cu_seqlens_q, cu_seqlens_k : int32, batch + 1 entries each: sequence b is rows
        ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q (and of k, v with cu_seqlens_k). Host
        values (NumPy arrays, lists) are checked at trace time; JAX arrays (traced, so that
        one compiled step serves every batch) are trusted as the CuPy API trusts device
        arrays: a wrong one makes the kernels read and write out of bounds.
    max_seqlen_q, max_seqlen_k : int, static: the longest sequence's lengths (they size the
        grid; at least the real longest). None with host cu_seqlens: computed from them.
    The other options as :func:`flash_attention`; alibi_slopes (nheads,) or (batch, nheads).
    With ``deterministic=True`` the backward reads cu_seqlens back to the host (a
    synchronisation inside the step, as :func:`cuflash.backward_varlen` does).

    Returns ``out`` (q's shape and dtype), or ``(out, lse)`` with lse float32 (nheads,
    total_q). Not under ``vmap`` (one packed batch is already the batch).
    """
    q, k, v = (jnp.asarray(x) for x in (q, k, v))
    for name, x in (("q", q), ("k", k), ("v", v)):
        _api._check_packed_rank(name, x)
    cus, hosts = [], []
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, q.shape[0]),
                            ("cu_seqlens_k", cu_seqlens_k, k.shape[0])):
        if isinstance(cu, jax.Array):  # (tracers too)
            _api._check_cu_array(name, _Meta(cu))
            cus.append(cu)
            hosts.append(None)
        else:  # host values: checked here (reference.check_cu_seqlens), then a constant
            host = reference.check_cu_seqlens(cu, total, name)
            cus.append(jnp.asarray(host, jnp.int32))
            hosts.append(host)
    batch = _api._check_cu_sizes(cus[0].shape[0], cus[1].shape[0])
    maxes = (_api._max_seqlen("max_seqlen_q", max_seqlen_q, hosts[0]),
             _api._max_seqlen("max_seqlen_k", max_seqlen_k, hosts[1]))
    # the dense checks on the batch of one that the kernels address per entry (forward_varlen's)
    one = [jax.ShapeDtypeStruct((1,) + x.shape, x.dtype) for x in (q, k, v)]
    opts = _options(*one, causal, softmax_scale, window_size, softcap, alibi_slopes,
                    deterministic, "fa2", batch=batch, seqlens=maxes)
    opts = dataclasses.replace(opts, packed=maxes)
    slopes = None
    if alibi_slopes is not None:
        slopes = jnp.broadcast_to(alibi_slopes, (batch, q.shape[1]))
    out, lse = _attention_jit(opts, q, k, v, slopes, cus[0], cus[1])
    return (out, lse) if return_lse else out


def flash_attention_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None,
                            block_table=None, causal: bool = False,
                            softmax_scale: float | None = None, window_size=(-1, -1),
                            softcap: float = 0.0, alibi_slopes=None, num_splits: int = 0,
                            return_lse: bool = False):
    """KV-cache decoding on JAX arrays: :func:`cuflash.forward_kvcache` (split-KV, GQA
    packing, paged caches) under ``jax.jit``, on XLA's stream.

    q : (batch, seqlen_q, heads, d); k_cache, v_cache : (batch, capacity, heads_k, d), or paged
        (num_pages, page_size, heads_k, d) with block_table (batch, pages per entry) int32.
    cache_seqlens : keys already cached per entry: an int, host integers (checked at trace
        time against the capacity and the block table), or an int32 (batch,) JAX array
        (traced, trusted as the CuPy API trusts device arrays: a wrong one reads or writes
        out of bounds); block_table likewise.
    k, v : optional new keys and values (batch, seqlen_new, heads_k, d) appended at
        cache_seqlens before attending. The caches are then outputs too: the result is
        ``(out, k_cache, v_cache)`` (``(out, lse, k_cache, v_cache)`` with return_lse), the
        updated caches aliased to the inputs (``input_output_aliases``): inside ``jax.jit``
        with the caches donated (``donate_argnums``) the append writes in place, otherwise
        XLA copies the caches first. cache_seqlens is not advanced: the caller does that.
    The options as :func:`cuflash.forward_kvcache`. Inference only: not differentiable, and
    not under ``vmap``.
    """
    q, k_cache, v_cache = (jnp.asarray(x) for x in (q, k_cache, v_cache))
    if k is not None:
        k = jnp.asarray(k)
    if v is not None:
        v = jnp.asarray(v)
    paged = block_table is not None
    seqlen_new = _kvcache._check_shapes(*(None if x is None else _Meta(x)
                                          for x in (q, k_cache, v_cache, k, v)), paged)
    batch, seqlen_q, nheads, d = q.shape
    # the block table and the cached lengths: host values checked here, traced ones trusted
    # (forward_kvcache's own checks, with JAX arrays in the role of its device arrays)
    traced = lambda x: isinstance(x, jax.Array)  # noqa: E731  (tracers too)
    table_host, lens_host, capacity = _kvcache._check_lengths_and_table(
        _Meta(k_cache), cache_seqlens, block_table, seqlen_new, batch, traced)
    table = block_table if table_host is None else jnp.asarray(table_host, jnp.int32)
    lens = cache_seqlens if lens_host is None else jnp.asarray(lens_host, jnp.int32)
    _kvcache._check_num_splits(num_splits)
    causal = _api._check_flag("causal", causal)
    scale = _api._softmax_scale(softmax_scale, d)
    _api._call_features(None, causal, window_size, softcap, _slopes_meta(alibi_slopes),
                        _Meta(q), batch, seqlen_q, capacity, d, scale)
    opts = _Options(causal, scale, tuple(int(w) for w in window_size), float(softcap), False,
                    np.dtype(q.dtype).name, "fa2", decode=int(num_splits))
    slopes = None if alibi_slopes is None else \
        jnp.broadcast_to(jnp.asarray(alibi_slopes, jnp.float32), (batch, nheads))
    results = _decode_jit(opts, k is not None, q, k_cache, v_cache, lens, k, v, table, slopes)
    head = results[:2] if return_lse else results[:1]
    if k is not None:  # the caches with the new keys (unchanged where none are new)
        return head + results[2:]
    return head if return_lse else head[0]


def _decode(opts, append: bool, q, k_cache, v_cache, lens, k, v, table, slopes):
    batch, seqlen_q, nheads, _ = q.shape
    shapes = [jax.ShapeDtypeStruct(q.shape, q.dtype),
              jax.ShapeDtypeStruct((batch, nheads, seqlen_q), jnp.float32)]
    if append:  # the caches, written in place: inputs 1 and 2 are outputs 2 and 3
        shapes += [jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype)] * 2
    return tuple(jax.lax.platform_dependent(
        q, k_cache, v_cache, lens, k, v, table, slopes,
        cuda=lambda *a: tuple(_decode_callback(opts, "cuda", tuple(shapes))(*a)),
        cpu=lambda *a: tuple(_decode_callback(opts, "cpu", tuple(shapes))(*a))))


# (through jit even for eager callers: the arrays' device picks the platform, see _attention_jit)
_decode_jit = jax.jit(_decode, static_argnums=(0, 1))


@functools.lru_cache(maxsize=256)
def _decode_callback(opts, platform: str, shapes: tuple):
    run = _gpu_decode if platform == "cuda" else _cpu_decode
    return buffer_callback(functools.partial(run, opts), shapes,
                           input_output_aliases={1: 2, 2: 3} if len(shapes) > 2 else None)


# --- trace-time checks ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Options:
    """A call's static options, checked; hashable (the custom_vjp's non-differentiable
    argument and the key of the cached callbacks)."""
    causal: bool
    scale: float
    window_size: tuple
    softcap: float
    deterministic: bool
    dtype: str
    algorithm: str
    packed: tuple | None = None  # (max_seqlen_q, max_seqlen_k) of a packed batch
    command_buffer: bool = False
    decode: int | None = None  # KV-cache decoding: its num_splits (0: chosen)


class _Meta:
    """What cuflash's checks read of an array (shape, dtype, C-contiguous strides), from a JAX
    array or tracer: the CuPy API's own checks run on it at trace time."""

    def __init__(self, x):
        self.shape, self.dtype = tuple(x.shape), np.dtype(x.dtype)
        self.ndim, self.itemsize = len(self.shape), self.dtype.itemsize
        self.size = math.prod(self.shape)
        strides, step = [], self.itemsize
        for n in reversed(self.shape):
            strides.append(step)
            step *= n
        self.strides = tuple(reversed(strides))


def _slopes_meta(alibi_slopes):
    """alibi_slopes' metadata for the CuPy API's checks (None: no ALiBi)."""
    if alibi_slopes is None:
        return None
    if not hasattr(alibi_slopes, "shape"):
        raise TypeError(f"alibi_slopes must be a JAX array, got "
                        f"{type(alibi_slopes).__qualname__}")
    return _Meta(alibi_slopes)


def _options(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes,
             deterministic, algorithm, batch=None, seqlens=None) -> _Options:
    """The checks of cuflash.forward on metadata. batch, seqlens: a packed batch's entries and
    longest lengths (the batch of one q, k, v then stand for)."""
    meta = [_Meta(x) for x in (q, k, v)]
    _api._check_shapes_uncached(*meta)
    causal = _api._check_flag("causal", causal)
    deterministic = _api._check_flag("deterministic", deterministic)
    _api._check_algorithm(algorithm)
    _, seqlen_q, _, d = meta[0].shape
    seqlen_k = meta[1].shape[1]
    if batch is None:
        batch = meta[0].shape[0]
    if seqlens is not None:
        seqlen_q, seqlen_k = seqlens
    scale = _api._softmax_scale(softmax_scale, d)
    # window, softcap, slopes and what algorithm="fa1" refuses: the CuPy API's own checks,
    # on metadata (cupy None)
    _api._call_features(None, causal, window_size, softcap, _slopes_meta(alibi_slopes),
                        meta[0], batch, seqlen_q, seqlen_k, d, scale, algorithm)
    return _Options(causal, scale, tuple(int(w) for w in window_size), float(softcap),
                    deterministic, np.dtype(q.dtype).name, algorithm)


# --- the custom VJP (dense and packed batches alike) ---------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(opts, q, k, v, slopes, cu_q=None, cu_k=None):
    return _forward_call(opts, q, k, v, slopes, cu_q, cu_k)


def _attention_fwd(opts, q, k, v, slopes, cu_q=None, cu_k=None):
    if slopes is not None and slopes.perturbed:
        raise ValueError("cuflash.jax computes no gradient with respect to alibi_slopes: pass "
                         "them through jax.lax.stop_gradient")
    q, k, v, slopes, cu_q, cu_k = (None if x is None else x.value
                                   for x in (q, k, v, slopes, cu_q, cu_k))
    out, lse = _forward_call(opts, q, k, v, slopes, cu_q, cu_k)
    return (out, lse), (q, k, v, slopes, cu_q, cu_k, out, lse)  # residuals: no N x N matrix


def _attention_bwd(opts, residuals, cotangents):
    q, k, v, slopes, cu_q, cu_k, out, lse = residuals
    dout, dlse = cotangents
    if not isinstance(dlse, SymbolicZero):
        raise ValueError("cuflash.jax's lse is not differentiable: a gradient flows into it "
                         "(use the lse only outside differentiated code, or through "
                         "jax.lax.stop_gradient)")
    if isinstance(dout, SymbolicZero):
        dout = jnp.zeros(out.shape, out.dtype)
    grads = _backward_call(opts, dout, q, k, v, out, lse, slopes, cu_q, cu_k)
    # Inside shard_map, an input the shards share (K, V replicated while Q is split) gets the
    # sum of the shards' parts of its gradient.
    dq, dk, dv = (g if not _varying(g) - _varying(x) else
                  jax.lax.psum(g, tuple(sorted(_varying(g) - _varying(x))))
                  for g, x in zip(grads, (q, k, v)))
    return dq, dk, dv, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)
# Called through jit even when the caller is not jitted: the computation is then placed, and
# its branch of platform_dependent chosen, by the arrays' device (eagerly, platform_dependent
# would follow JAX's default device instead).
_attention_jit = jax.jit(_attention, static_argnums=0)


def _varying(x) -> frozenset:
    """The shard_map axes along which x varies (JAX's manual axis type; `vma` before 0.10)."""
    aval = jax.typeof(x)
    kind = getattr(aval, "manual_axis_type", None)
    return frozenset(kind.varying if kind is not None else getattr(aval, "vma", ()) or ())


def _varying_like(outputs, *inputs) -> tuple:
    """Inside shard_map the callback's results carry no manual axes (buffer_callback drops
    them): give them the inputs', as the custom VJP's type check requires."""
    axes = frozenset().union(*(_varying(x) for x in inputs if x is not None))
    if not axes:
        return tuple(outputs)
    cast = getattr(jax.lax, "pcast", None)
    out = []
    for x in outputs:
        missing = tuple(sorted(axes - _varying(x)))
        if missing:
            x = cast(x, missing, to="varying") if cast else jax.lax.pvary(x, missing)
        out.append(x)
    return tuple(out)


def _forward_call(opts, q, k, v, slopes, cu_q=None, cu_k=None):
    """(out, lse) from one buffer callback: cuflash's kernels on CUDA, the reference on CPU.
    A packed batch (opts.packed; cu_q, cu_k its cu_seqlens) has lse (heads, total_q)."""
    if opts.packed:
        lse_shape = (q.shape[1], q.shape[0])
        args = (q, k, v, slopes, cu_q, cu_k)
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
        args = (q, k, v, slopes)
    shapes = (jax.ShapeDtypeStruct(q.shape, q.dtype),
              jax.ShapeDtypeStruct(lse_shape, jnp.float32))
    return _varying_like(_platform_call(opts, "forward", shapes, *args), q, k, v, slopes)


def _platform_call(opts, which: str, shapes: tuple, *args):
    return jax.lax.platform_dependent(
        *args,
        cuda=lambda *a: _callback(opts, which, "cuda", shapes)(*a),
        cpu=lambda *a: _callback(opts, which, "cpu", shapes)(*a))


def _backward_call(opts, dout, q, k, v, out, lse, slopes, cu_q=None, cu_k=None):
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    if opts.packed:  # (backward_varlen allocates its own scratch)
        return _platform_call(opts, "backward", shapes, dout, q, k, v, out, lse, slopes, cu_q,
                              cu_k)
    # On CUDA the callback also writes a scratch buffer that XLA allocates (D, the dQ sums,
    # ...: _api._backward_scratch): nothing is allocated inside the callback.
    scratch = (jax.ShapeDtypeStruct((_scratch_bytes(opts, q, k, slopes),), jnp.uint8),)
    grads = jax.lax.platform_dependent(
        dout, q, k, v, out, lse, slopes,
        cuda=lambda *a: tuple(_callback(opts, "backward", "cuda", shapes + scratch)(*a)[:3]),
        cpu=lambda *a: _callback(opts, "backward", "cpu", shapes)(*a))
    return _varying_like(grads, q, k, v, dout)


def _scratch_bytes(opts, q, k, slopes) -> int:
    """The backward's scratch on the current GPU (at least 1 byte; 1 where no GPU is visible:
    the CUDA branch is then traced but never run)."""
    if _api.gpu_missing():
        return 1
    return max(1, _api._backward_scratch_bytes(
        q.shape, k.shape, opts.causal, opts.window_size, opts.softcap,
        None if slopes is None else _Meta(slopes), opts.deterministic))


@functools.lru_cache(maxsize=256)
def _callback(opts: _Options, which: str, platform: str, shapes: tuple):
    """One buffer_callback per (options, pass, platform, shapes), kept: the same traced call
    gives the same primitive, and jit's caches see equal computations. vmap folds its axes
    into the batch (broadcast_all: every input gets them, the callback reshapes)."""
    run = {("forward", "cuda"): _gpu_forward, ("backward", "cuda"): _gpu_backward,
           ("forward", "cpu"): _cpu_forward, ("backward", "cpu"): _cpu_backward}
    if opts.packed:
        run = {("forward", "cuda"): _gpu_forward_varlen,
               ("backward", "cuda"): _gpu_backward_varlen,
               ("forward", "cpu"): _cpu_forward_varlen,
               ("backward", "cpu"): _cpu_backward_varlen}
    fn = run[which, platform]
    kept = ({},) if fn is _gpu_forward else ()  # (the launches it keeps: its own)
    return buffer_callback(functools.partial(fn, opts, *kept), shapes,
                           vmap_method=None if opts.packed else "broadcast_all",
                           command_buffer_compatible=opts.command_buffer and platform == "cuda")


def _fold(shape: tuple, tail: int) -> tuple:
    """vmap's leading axes folded into the batch: (*B, batch, rest...) -> (-1, rest...)."""
    return (-1,) + tuple(shape[len(shape) - tail + 1:])


# --- CUDA: cuflash's kernels on XLA's stream -----------------------------------------------

_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": jnp.dtype(jnp.bfloat16),
           "float32": np.dtype(np.float32), "int32": np.dtype(np.int32),
           "uint8": np.dtype(np.uint8)}
_streams: dict = {}


class _XlaStream:
    """XLA's stream as the CUDA stream protocol's object (for cupy.cuda.Stream.from_external)."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def _stream(cupy, ptr: int, buffers):
    """(XLA's stream as a cupy.cuda.Stream, its device id), made once per stream; None where
    every buffer is empty (nothing to compute, nothing to write)."""
    hit = _streams.get(ptr)
    if hit is None:
        live = [b for b in buffers if b is not None and math.prod(b.shape)]
        if not live:
            return None
        device = cupy.cuda.runtime.pointerGetAttributes(_pointer(live[0])).device
        with cupy.cuda.Device(device):
            hit = _streams[ptr] = (cupy.cuda.Stream.from_external(_XlaStream(ptr)), device)
    return hit


def _pointer(buf) -> int:
    return buf.__cuda_array_interface__["data"][0]


def _view(cupy, buf, dtype: str, tail: int, device: int):
    """An XLA buffer as a cupy.ndarray of the given dtype (bf16 buffers report a void dtype),
    no copy, with vmap's leading axes folded into the first of its `tail` dims.

    Views are kept (_views) by everything they are made of: address, shape, dtype, folding and
    device. XLA hands a jitted step the same few addresses call after call, and a kept view
    spares each buffer CuPy's three constructors (a microsecond or more apiece, on the
    critical path of every call without command buffers). A view holds only the address, no
    reference to XLA's buffer, which is valid during the callback alone: a view kept from an
    earlier call over the same address is the view this call would make (nothing in cuflash
    changes an array's shape or strides in place), and a new address makes a new view."""
    if buf is None:
        return None
    cai = buf.__cuda_array_interface__  # (built afresh on every access: read once)
    key = (cai["data"][0], cai["shape"], dtype, tail, device)
    x = _views.get(key)
    if x is None:
        x = _api._keep(_views, key, _new_view(cupy, *key))
    return x


_views: dict = {}


def _new_view(cupy, ptr: int, shape: tuple, dtype: str, tail: int, device: int):
    dt = _DTYPES[dtype]
    shape = tuple(shape)
    if not math.prod(shape):  # (XLA may pass no address for an empty buffer)
        x = cupy.ndarray(shape, dt)
    else:
        mem = cupy.cuda.UnownedMemory(ptr, math.prod(shape) * dt.itemsize, None, device)
        x = cupy.ndarray(shape, dt, cupy.cuda.MemoryPointer(mem, 0))
    return x if x.ndim == tail else x.reshape(_fold(shape, tail))


def _features(opts: _Options) -> dict:
    return dict(causal=opts.causal, softmax_scale=opts.scale, window_size=opts.window_size,
                softcap=opts.softcap)


def _on_xla_stream(body):
    """A CUDA buffer callback from its body, body(opts, view, outputs, *inputs, **kwargs):
    run with XLA's stream current on the buffers' GPU (not at all where every output is empty:
    nothing to compute or write); view(buffer, dtype=opts.dtype, tail=4) is _view on that
    GPU."""
    @functools.wraps(body)
    def callback(opts, ctx, outputs, *inputs, **kwargs):
        cupy = _api._cupy()
        hit = _stream(cupy, ctx.stream, outputs)
        if hit is None:
            return
        stream, device = hit

        def view(buf, dtype=opts.dtype, tail=4):
            return _view(cupy, buf, dtype, tail, device)
        with _api._on_device(cupy, device), stream, _api._allocation_free():
            body(opts, view, outputs, *inputs, **kwargs)
    return callback


def _gpu_forward(opts, kept, ctx, outputs, q, k, v, slopes):
    """The forward's CUDA callback. A jitted step hands it the same few buffer addresses call
    after call: from the third call on a set of addresses (forward keeps a launch from its
    second, _api._kept_forward), the launch's parameter bytes are kept in `kept` (this
    callback's own) by the stream, the addresses and shapes, and launched straight away, with
    none of forward's checks, views or lookups. On the same addresses with the same shapes
    and options, every check forward made passes again, and the bytes it would pack are these
    (_api._Repeat.filled). FlashAttention-2 without ALiBi only (forward keeps no launch for
    the others)."""
    key = None
    if slopes is None and opts.algorithm == "fa2":
        key = (ctx.stream, _api._portable_only,
               *((c["data"][0], c["shape"]) for c in
                 (b.__cuda_array_interface__ for b in (*outputs, q, k, v))))
        hit = kept.get(key)
        if hit is not None and hit[0].replay(hit[1], ctx.stream):
            return
    _gpu_forward_checked(opts, ctx, outputs, q, k, v, slopes, kept=kept, key=key)


@_on_xla_stream
def _gpu_forward_checked(opts, view, outputs, q, k, v, slopes, *, kept, key):
    out, lse = outputs
    q, k, v, out, lse = view(q), view(k), view(v), view(out), view(lse, "float32", 3)
    _api.forward(q, k, v, **_features(opts), alibi_slopes=view(slopes, "float32", 2), out=out,
                 lse=lse, algorithm=opts.algorithm)
    if key is not None:
        launch = _api._kept_forward(q, k, v, out, lse, opts.causal, opts.scale,
                                    opts.window_size, opts.softcap, opts.algorithm)
        if launch is not None:
            _api._keep(kept, key, launch)


@_on_xla_stream
def _gpu_backward(opts, view, outputs, dout, q, k, v, out, lse, slopes):
    dq, dk, dv, scratch = outputs
    # (backward()'s own body, with the scratch carved from XLA's buffer)
    _api._backward(view(dout), view(q), view(k), view(v), view(out), view(lse, "float32", 3),
                   opts.causal, opts.scale, opts.deterministic, view(dq), view(dk), view(dv),
                   None, opts.window_size, opts.softcap, view(slopes, "float32", 2),
                   scratch=view(scratch, "uint8", 1))


@_on_xla_stream
def _gpu_forward_varlen(opts, view, outputs, q, k, v, slopes, cu_q, cu_k):
    out, lse = outputs
    _api.forward_varlen(view(q, tail=3), view(k, tail=3), view(v, tail=3),
                        view(cu_q, "int32", 1), view(cu_k, "int32", 1), *opts.packed,
                        **_features(opts), alibi_slopes=view(slopes, "float32", 2),
                        out=view(out, tail=3), lse=view(lse, "float32", 2))


@_on_xla_stream
def _gpu_backward_varlen(opts, view, outputs, dout, q, k, v, out, lse, slopes, cu_q, cu_k):
    dq, dk, dv = (view(x, tail=3) for x in outputs)
    _api.backward_varlen(view(dout, tail=3), view(q, tail=3), view(k, tail=3),
                         view(v, tail=3), view(out, tail=3), view(lse, "float32", 2),
                         view(cu_q, "int32", 1), view(cu_k, "int32", 1), *opts.packed,
                         **_features(opts), alibi_slopes=view(slopes, "float32", 2),
                         deterministic=opts.deterministic, dq=dq, dk=dk, dv=dv)


@_on_xla_stream
def _gpu_decode(opts, view, outputs, q, k_cache, v_cache, lens, k, v, table, slopes):
    # with an append the caches are outputs aliased to the inputs (the same buffers)
    k_cache, v_cache = outputs[2:] if len(outputs) > 2 else (k_cache, v_cache)
    _kvcache.forward_kvcache(
        view(q), view(k_cache), view(v_cache), view(lens, "int32", 1), k=view(k), v=view(v),
        block_table=view(table, "int32", 2), **_features(opts),
        alibi_slopes=view(slopes, "float32", 2), num_splits=opts.decode, out=view(outputs[0]),
        lse=view(outputs[1], "float32", 3))


# --- CPU: the float64 reference (tests, debugging) -----------------------------------------

def _host(buf, tail: int):
    if buf is None:
        return None
    x = np.asarray(buf)
    return x if x.ndim == tail else x.reshape(_fold(x.shape, tail))


def _cpu_forward(opts, ctx, outputs, q, k, v, slopes):
    del ctx
    O, L = reference.attention_naive(*(_host(x, 4) for x in (q, k, v)), **_features(opts),
                                     alibi_slopes=_host(slopes, 2))
    out, lse = (np.asarray(x) for x in outputs)
    out[...] = O.astype(out.dtype).reshape(out.shape)
    lse[...] = L.astype(np.float32).reshape(lse.shape)


def _cpu_backward(opts, ctx, outputs, dout, q, k, v, out, lse, slopes):
    # The FA2 recompute backward from the forward's residuals out and L (their plumbing is
    # what this checks), in float64.
    del ctx
    grads = reference.attention_backward_fa2_tiled(
        *(_host(x, 4) for x in (dout, q, k, v, out)), _host(lse, 3), **_features(opts),
        alibi_slopes=_host(slopes, 2))
    for g, buf in zip(grads, outputs):
        dst = np.asarray(buf)
        dst[...] = g.astype(dst.dtype).reshape(dst.shape)


def _cpu_forward_varlen(opts, ctx, outputs, q, k, v, slopes, cu_q, cu_k):
    del ctx
    O, L = reference.attention_naive_varlen(*(np.asarray(x) for x in (q, k, v, cu_q, cu_k)),
                                            **_features(opts), alibi_slopes=_host(slopes, 2))
    out, lse = (np.asarray(x) for x in outputs)
    out[...] = O.astype(out.dtype)
    lse[...] = L.astype(np.float32)


def _cpu_backward_varlen(opts, ctx, outputs, dout, q, k, v, out, lse, slopes, cu_q, cu_k):
    del ctx, out, lse  # (the float64 gradients recompute them)
    grads = reference.attention_backward_naive_varlen(
        *(np.asarray(x) for x in (dout, q, k, v, cu_q, cu_k)), **_features(opts),
        alibi_slopes=_host(slopes, 2))
    for g, buf in zip(grads, outputs):
        dst = np.asarray(buf)
        dst[...] = g.astype(dst.dtype)


def _cpu_decode(opts, ctx, outputs, q, k_cache, v_cache, lens, k, v, table, slopes):
    del ctx
    q, kc, vc, lens = (np.asarray(x) for x in (q, k_cache, v_cache, lens))
    k, v, table, slopes = (None if x is None else np.asarray(x) for x in (k, v, table, slopes))
    O, L = reference.attention_kvcache_naive(q, kc, vc, lens, k=k, v=v, block_table=table,
                                             **_features(opts), alibi_slopes=slopes)
    out, lse = (np.asarray(x) for x in outputs[:2])
    out[...] = O.astype(out.dtype)
    lse[...] = L.astype(np.float32)
    if k is not None:  # the appended caches (the outputs alias the inputs)
        for dst, src in zip(outputs[2:], reference.kvcache_append(kc, vc, lens, k, v, table)):
            np.asarray(dst)[...] = src
