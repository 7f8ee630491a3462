"""Public API: validation, allocation, dispatch. No kernel logic lives here."""

from __future__ import annotations

import math

import numpy as np

from . import _loader, _plan

MIN_COMPUTE_CAPABILITY = 80
_GRID_YZ_MAX = 65535  # CUDA limit on gridDim.y / gridDim.z (heads, batch)


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "cuflash needs CuPy: pip install 'cuflash[cuda12]' (or [cuda13])") from exc
    return cupy


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _check_type(cupy, name: str, x) -> None:
    if isinstance(x, np.ndarray):
        raise TypeError(f"{name} is a numpy.ndarray; cuflash runs on the GPU: pass "
                        f"cupy.asarray({name}) instead")
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray, got {type(x).__module__}."
                        f"{type(x).__qualname__}")


def _check_layout(name: str, x) -> None:
    """Rank, dtype and last-dim contiguity (metadata only: works on NumPy arrays too)."""
    if x.ndim != 4:
        raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, headdim), got shape "
                         f"{x.shape}")
    if _dtype_name(x.dtype) not in _plan.ELEMENT_TAGS:
        raise TypeError(f"{name} has dtype {x.dtype}; cuflash supports float16 and bfloat16 "
                        "(ml_dtypes.bfloat16)")
    if x.size and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        raise ValueError(f"{name} must be contiguous in its last (headdim) dimension, got "
                         f"strides {x.strides}; use cupy.ascontiguousarray({name})")


def _check_device(cupy, arrays: dict) -> int:
    devices = {name: a.device.id for name, a in arrays.items()}
    if len(set(devices.values())) != 1:
        raise ValueError(f"all arrays must be on the same GPU, got devices {devices}")
    device_id = next(iter(devices.values()))
    cc = int(cupy.cuda.Device(device_id).compute_capability)
    if cc < MIN_COMPUTE_CAPABILITY:
        raise RuntimeError(
            f"cuflash needs a GPU of compute capability 8.0 (sm_80) or newer; device "
            f"{device_id} has compute capability {cc // 10}.{cc % 10}")
    return device_id


def _aligned(cupy, x):
    """x itself when every row starts on a 16-byte boundary (cp.async needs it), else an
    aligned contiguous copy (possible only for views at odd offsets; correct, just slower)."""
    ok = x.size == 0 or x.data.ptr % 16 == 0 and all(
        (s // x.itemsize) % 8 == 0 for s, n in zip(x.strides[:-1], x.shape[:-1]) if n > 1)
    return x if ok else x.copy()  # a fresh allocation is 256-byte aligned and contiguous


def _check_shapes(q, k, v) -> None:
    """Every check that needs only shapes, dtypes and strides (no GPU)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_layout(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    batch, seqlen_q, nheads, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    bk, seqlen_k, nheads_k, dk = k.shape
    if bk != batch or dk != d:
        raise ValueError(f"k/v shape {k.shape} does not match q shape {q.shape}: batch and "
                         "headdim must agree")
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"q heads ({nheads}) must be a multiple of k/v heads ({nheads_k})")
    if d % 8 != 0 or not 8 <= d <= _plan.MAX_HEAD_DIM:
        raise ValueError(f"head dim {d} is not supported: it must be a multiple of 8 between 8 "
                         f"and {_plan.MAX_HEAD_DIM}")
    if nheads > _GRID_YZ_MAX or batch > _GRID_YZ_MAX:
        raise ValueError(f"batch ({batch}) and heads ({nheads}) must each be <= {_GRID_YZ_MAX}")
    if max(seqlen_q, seqlen_k) >= 2**31 - 256:
        raise ValueError("sequence lengths must be < 2**31 - 256")


def _check_out(name, x, shape, dtype) -> None:
    if tuple(x.shape) != tuple(shape) or x.dtype != dtype:
        raise ValueError(f"{name} must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, "
                         f"got {tuple(x.shape)} {x.dtype}")


def _check_qkv(q, k, v):
    cupy = _cupy()
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_type(cupy, name, x)
    _check_shapes(q, k, v)
    device_id = _check_device(cupy, {"q": q, "k": k, "v": v})
    return cupy, device_id


def _softmax_scale(softmax_scale, d: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(d)
    scale = float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be a finite positive number, got {softmax_scale}")
    return scale


def _strides(x) -> tuple:
    """(batch, seq, head) strides in elements, as the kernels' int64 arguments."""
    return tuple(np.int64(s // x.itemsize) for s in x.strides[:3])


def forward(q, k, v, causal: bool = False, softmax_scale: float | None = None, *,
            out=None, lse=None, _config: _plan.ForwardConfig | None = None):
    """FlashAttention-2 forward: ``out = softmax(softmax_scale * q k^T [+ causal mask]) v``.

    Parameters
    ----------
    q : cupy.ndarray, (batch, seqlen_q, nheads, headdim), float16 or bfloat16
    k, v : cupy.ndarray, (batch, seqlen_k, nheads_k, headdim), same dtype as q.
        ``nheads % nheads_k == 0``; query head h reads key/value head
        ``h // (nheads // nheads_k)`` (MQA / GQA). Any strides with a contiguous last dim.
        headdim: a multiple of 8, at most 256.
    causal : bool
        Mask aligned to the bottom-right corner: query i sees key j iff
        ``j <= i + seqlen_k - seqlen_q``. Rows that see no key get out = 0, lse = -inf.
    softmax_scale : float, default ``1 / sqrt(headdim)``
    out, lse : optional preallocated outputs (shapes and dtypes as returned; ``out`` may have
        any strides with a contiguous last dim, ``lse`` must be contiguous).

    Returns
    -------
    out : cupy.ndarray, (batch, seqlen_q, nheads, headdim), q's dtype
    lse : cupy.ndarray, (batch, nheads, seqlen_q), float32: the log-sum-exp L of each row of
        ``softmax_scale * q k^T`` (natural log), as the backward pass needs it.

    Runs on CuPy's current stream, on the device that holds q.
    """
    cupy, device_id = _check_qkv(q, k, v)
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    scale = _softmax_scale(softmax_scale, d)

    with cupy.cuda.Device(device_id):
        if out is None:
            out = cupy.empty(q.shape, dtype=q.dtype)
        else:
            _check_type(cupy, "out", out)
            _check_out("out", out, q.shape, q.dtype)
            _check_layout("out", out)
            _check_device(cupy, {"q": q, "out": out})
            if _aligned(cupy, out) is not out:
                raise ValueError("out must start on a 16-byte boundary with strides that are "
                                 "multiples of 8 elements")
        if lse is None:
            lse = cupy.empty((batch, nheads, seqlen_q), dtype=cupy.float32)
        else:
            _check_type(cupy, "lse", lse)
            _check_out("lse", lse, (batch, nheads, seqlen_q), np.float32)
            _check_device(cupy, {"q": q, "lse": lse})
            if not lse.flags.c_contiguous:
                raise ValueError("lse must be C-contiguous")
        if out.size == 0:
            return out, lse
        q, k, v = (_aligned(cupy, x) for x in (q, k, v))
        D = _plan.head_dim_bucket(d)
        cfg = _config or _plan.forward_config(D, causal, _max_smem(cupy, device_id))
        kernel = _loader.get_kernel(
            _plan.FORWARD_FILE, _plan.forward_kernel_name(_dtype_name(q.dtype), cfg, causal))
        _set_smem(kernel, cfg.smem_bytes)
        grid = ((seqlen_q + cfg.B_r - 1) // cfg.B_r, nheads, batch)
        kernel(grid, (cfg.threads,),
               (q, k, v, out, lse,
                np.int32(seqlen_q), np.int32(seqlen_k), np.int32(d),
                np.int32(nheads // nheads_k),
                *_strides(q), *_strides(k), *_strides(v), *_strides(out),
                np.float32(scale), np.float32(scale * math.log2(math.e))),
               shared_mem=cfg.smem_bytes)
    return out, lse


def precompile(dtypes=("float16", "bfloat16"), head_dims=None, causal=(False, True),
               max_workers: int = 8) -> int:
    """Compile (or load from CuPy's cache) the kernels for the current device ahead of time,
    in parallel. Returns how many specialisations were prepared."""
    from concurrent.futures import ThreadPoolExecutor

    cupy = _cupy()
    device_id = cupy.cuda.Device().id
    buckets = sorted({_plan.head_dim_bucket(d) for d in (head_dims or _plan.HEAD_DIM_BUCKETS)})
    max_smem = _max_smem(cupy, device_id)
    names = [_plan.forward_kernel_name(dt if isinstance(dt, str) else _dtype_name(dt),
                                       _plan.forward_config(D, c, max_smem), c)
             for dt in dtypes for D in buckets for c in causal]

    def build(name):
        with cupy.cuda.Device(device_id):
            _loader.get_kernel(_plan.FORWARD_FILE, name)

    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        list(pool.map(build, names))
    return len(names)


_smem_limits: dict = {}


def _max_smem(cupy, device_id: int) -> int:
    if device_id not in _smem_limits:
        attrs = cupy.cuda.runtime.getDeviceProperties(device_id)
        _smem_limits[device_id] = int(attrs["sharedMemPerBlockOptin"])
    return _smem_limits[device_id]


def _set_smem(kernel, nbytes: int) -> None:
    if nbytes > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < nbytes:
        kernel.max_dynamic_shared_size_bytes = nbytes
