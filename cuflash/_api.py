"""Public API: validation, allocation, dispatch. No kernel logic lives here."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import struct
import threading
import types
from functools import lru_cache

import numpy as np

from . import _loader, _plan, _registry, _tma

MIN_COMPUTE_CAPABILITY = 80
_GRID_YZ_MAX = _registry.GRID_YZ_MAX  # CUDA limit on gridDim.y / gridDim.z


# The one install hint every message gives (README.md, "Set up").
INSTALL_HINT = ('pip install "cupy-cuda12x[ctk]>=14" (CUDA 12 driver) or '
                '"cupy-cuda13x[ctk]>=14" (CUDA 13 driver)')
NO_GPU_MESSAGE = ("no CUDA GPU found on this machine: cuflash's kernels need an NVIDIA GPU of "
                  "compute capability 8.0 or newer and its driver")


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"cuflash needs CuPy 14 or newer: {INSTALL_HINT}") from exc
    return cupy


def gpu_missing() -> str | None:
    """Why cuflash cannot run here (no CuPy, or no CUDA GPU), or None: for scripts that want
    to say so and stop rather than fail with a traceback."""
    try:
        import cupy
    except ImportError:
        return f"CuPy is not installed: {INSTALL_HINT}"
    return None if cupy.cuda.is_available() else NO_GPU_MESSAGE


def _require_gpu(cupy) -> None:
    """A clear RuntimeError where no CUDA GPU is usable (instead of a driver traceback)."""
    if not cupy.cuda.is_available():
        raise RuntimeError(NO_GPU_MESSAGE)


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


_DTYPE_NAMES: dict = {}


def _check_type(cupy, name: str, x) -> None:
    if isinstance(x, np.ndarray):
        raise TypeError(f"{name} is a numpy.ndarray; cuflash runs on the GPU: pass "
                        f"cupy.asarray({name}) instead")
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray, got {type(x).__module__}."
                        f"{type(x).__qualname__}")


def _check_layout(name: str, x) -> None:
    """Rank, dtype, strides in whole elements and last-dim contiguity (metadata only: works on
    NumPy arrays too)."""
    if x.ndim != 4:
        raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, headdim), got shape "
                         f"{x.shape}")
    if _dtype_name(x.dtype) not in _plan.ELEMENT_TAGS:
        raise TypeError(f"{name} has dtype {x.dtype}; cuflash supports float16 and bfloat16 "
                        "(ml_dtypes.bfloat16)")
    _check_strides(name, x)
    if x.size and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        raise ValueError(f"{name} must be contiguous in its last (headdim) dimension, got "
                         f"strides {x.strides}; use cupy.ascontiguousarray({name})")


def _keep(cache: dict, key, value):
    """cache[key] = value, the cache emptied first once it holds 1024 entries: the memos of
    layouts, launches and grids that spare a loop's calls their repeated work (a loop uses a
    few keys; a stream of new shapes must not grow them without bound). Returns value."""
    if len(cache) >= 1024:
        cache.clear()
    cache[key] = value
    return value


def _lookup(cache: dict, key) -> tuple:
    """(key, cache.get(key)) for a repeat's key (None: not one to remember); (None, None) where
    the key cannot be hashed (an unhashable option: the full path then says what is wrong, and
    nothing is kept under it)."""
    if key is None:
        return None, None
    try:
        return key, cache.get(key)
    except Exception:
        return None, None


def _on_gpu(cupy, arrays, device_id: int) -> bool:
    """Whether every array given (None: absent) is a CuPy array on GPU device_id: what a
    repeated call checks first (_Repeat.run, _kvcache._DecodeRepeat.run)."""
    nd = cupy.ndarray
    return all(x is None or isinstance(x, nd) and x.data.device_id == device_id
               for x in arrays)


def _check_layout_once(name: str, x) -> None:
    """_check_layout, remembering the layouts (shape, strides, dtype) that passed: the
    outputs and gradients a loop passes have the same few every step."""
    key = (x.shape, x.strides, x.dtype)
    if key not in _layouts_passed:
        _check_layout(name, x)
        _keep(_layouts_passed, key, True)


_layouts_passed: dict = {}


def _check_strides(name: str, x) -> None:
    """The kernels take strides in elements: a byte stride that is not a whole number of
    elements (an as_strided view) cannot be expressed and would be rounded."""
    if x.size and any(s % x.itemsize for n, s in zip(x.shape, x.strides) if n > 1):
        raise ValueError(f"{name} has byte strides {x.strides} that are not multiples of its "
                         f"item size ({x.itemsize} bytes); use cupy.ascontiguousarray({name})")


def _check_device(cupy, arrays: dict) -> int:
    """The id of the one GPU holding every array; it must be sm_80 or newer."""
    device_id = _common_device({name: a.data.device_id for name, a in arrays.items()})
    if device_id not in _capable_devices:  # (a device's capability never changes)
        _check_capability(device_id, int(cupy.cuda.Device(device_id).compute_capability))
        _capable_devices.add(device_id)
    return device_id


_capable_devices: set = set()


def _common_device(devices: dict) -> int:
    if len(set(devices.values())) != 1:
        raise ValueError(f"all arrays must be on the same GPU, got devices {devices}")
    return next(iter(devices.values()))


def _check_capability(device_id: int, cc: int) -> None:
    if cc < MIN_COMPUTE_CAPABILITY:
        raise RuntimeError(
            f"cuflash needs a GPU of compute capability 8.0 (sm_80) or newer; device "
            f"{device_id} has compute capability {cc // 10}.{cc % 10}")


def _aligned(cupy, x):
    """x itself when every row starts on a 16-byte boundary (cp.async needs it), else an
    aligned contiguous copy (possible only for views at odd offsets; correct, just slower)."""
    ok = x.size == 0 or x.data.ptr % 16 == 0 and _rows_aligned(x.shape, x.strides, x.itemsize)
    return x if ok else x.copy()  # a fresh allocation is 256-byte aligned and contiguous


@lru_cache(maxsize=1024)
def _rows_aligned(shape, strides, itemsize) -> bool:
    return all((s // itemsize) % 8 == 0 for s, n in zip(strides[:-1], shape[:-1]) if n > 1)


def _check_shapes(q, k, v) -> tuple:
    """Every check that needs only shapes, dtypes and strides (no GPU). Layouts that passed
    once are remembered, with what the launches derive from them: training loops call with
    the same few layouts every step. Returns (strides, rows_aligned): the (batch, seq, head)
    strides of q, k, v in elements (three 3-tuples) and whether every row of all three starts on a
    16-byte boundary when the array itself does."""
    key = (q.shape, k.shape, v.shape, q.strides, k.strides, v.strides, q.dtype, k.dtype,
           v.dtype)
    derived = _layouts_ok.get(key)
    if derived is None:
        _check_shapes_uncached(q, k, v)
        derived = _keep(_layouts_ok, key, (
            (_strides(q), _strides(k), _strides(v)),
            all(_rows_aligned(x.shape, x.strides, x.itemsize) for x in (q, k, v))))
    return derived


_layouts_ok: dict = {}


def _check_shapes_uncached(q, k, v) -> None:
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
    if not 1 <= d <= _plan.MAX_HEAD_DIM:
        raise ValueError(f"head dim {d} is not supported: it must be between 1 and "
                         f"{_plan.MAX_HEAD_DIM}")
    if nheads > _GRID_YZ_MAX or batch > _GRID_YZ_MAX:
        raise ValueError(f"batch ({batch}) and heads ({nheads}) must each be <= {_GRID_YZ_MAX}")
    if max(seqlen_q, seqlen_k) >= 2**31 - 256:
        raise ValueError("sequence lengths must be < 2**31 - 256")


def _check_out(name, x, shape, dtype) -> None:
    if tuple(x.shape) != tuple(shape) or x.dtype != dtype:
        raise ValueError(f"{name} must have shape {tuple(shape)} and dtype {np.dtype(dtype)}, "
                         f"got {tuple(x.shape)} {x.dtype}")


def _check_given(cupy, name, x, shape, dtype, q, contiguous=False) -> None:
    """A caller-supplied array (gradient, output buffer, lse): CuPy, the expected shape and
    dtype, on q's GPU, and C-contiguous where the kernels write or read it as such."""
    _check_type(cupy, name, x)
    _check_out(name, x, shape, dtype)
    device_id = x.data.device_id
    if device_id != q.data.device_id or device_id not in _capable_devices:
        _check_device(cupy, {"q": q, name: x})
    if contiguous and not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")


def _check_output_alignment(name: str, x, nbytes: int) -> None:
    """The kernels store into out, dq, dk, dv with 16-byte vectors and into lse with 4-byte
    floats: a preallocated output must start on such a boundary (a misaligned store faults
    and leaves the CUDA context unusable for the rest of the process)."""
    if x.size and x.data.ptr % nbytes:
        raise ValueError(f"{name} must start on a {nbytes}-byte boundary (its address is "
                         f"{x.data.ptr:#x}); pass a freshly allocated array or leave {name}=None")


def _byte_range(ptr: int, x) -> tuple:
    """[first, last) bytes that array `x` at address `ptr` can touch (empty: (ptr, ptr))."""
    lo, hi = _extent(x.shape, x.strides, x.itemsize)
    return ptr + lo, ptr + hi


@lru_cache(maxsize=1024)
def _extent(shape: tuple, strides: tuple, itemsize: int) -> tuple:
    """[first, last) byte offsets from its address that an array of this layout can touch
    ((0, 0) when empty), kept per layout: training loops pass the same few."""
    if 0 in shape:
        return 0, 0
    lo = hi = 0
    for n, s in zip(shape, strides):
        if s > 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + itemsize


def _check_no_overlap(outputs: dict, others: dict) -> None:
    """ValueError where an output shares bytes with an input the kernels still read, or with
    another output. `outputs` and `others` map names to arrays. A byte-range test: views that
    interleave without touching the same element are refused too."""
    ranges = {name: _byte_range(x.data.ptr, x) for name, x in {**others, **outputs}.items()}
    pair = _overlapping(ranges, list(outputs))
    if pair:
        raise ValueError(f"{pair[0]} shares memory with {pair[1]}: cuflash's outputs must not "
                         "overlap its inputs or each other (pass a separate array)")


def _overlapping(ranges: dict, outputs: list):
    """The first (output, other) whose [first, last) byte ranges in `ranges` (name -> range)
    intersect, an output's empty range intersecting nothing; None if none do."""
    others = [n for n in ranges if n not in outputs]
    for i, name in enumerate(outputs):
        lo, hi = ranges[name]
        if lo == hi:
            continue
        for other in outputs[i + 1:] + others:
            olo, ohi = ranges[other]
            if olo < hi and lo < ohi:
                return name, other
    return None


def _check_flag(name: str, value) -> bool:
    """A bool argument: True/False or a NumPy bool. Anything else (a string such as "False",
    an int) is refused rather than read by its truth value."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _odd_d_features(upper: bool, local: bool, left: int, right: int, seqlen_q: int,
                    seqlen_k: int) -> tuple:
    """(local, left, right, hooked) for a head dim that is not a multiple of 8: its kernels
    (OddD tiles) always have the window and the hook, so a call without a window gets sides
    past every key (causal: right = 0), and the hook is always on (a call without softcap and
    ALiBi passes their defaults, which turn them off)."""
    if not local:
        left = right = seqlen_q + seqlen_k
        if upper:
            right = 0
    return True, left, right, True


def _window(causal: bool, window_size, seqlen_q: int, seqlen_k: int,
            diag_shift: int = 0) -> tuple:
    """(causal, local, left, right) of a call's mask, for the kernels' Mask<causal, local>
    (kernels/mask.cuh) and the parameters' window_left / window_right. window_size = (left,
    right), FlashAttention-2's convention: query i sees key j iff i + seqlen_k - seqlen_q -
    left <= j <= i + seqlen_k - seqlen_q + right; -1 leaves a side unbounded; causal forces
    right = 0. Without a left side the window is the plain or the causal mask; a right side
    other than causal's 0 takes the local kernels with a left side past every key.
    diag_shift (ring attention's blocks, cuflash.distributed): row i's diagonal is key i +
    seqlen_k - seqlen_q + diag_shift. The kernels' masks count from the unshifted diagonal,
    so the shift goes into the sides (left - diag_shift, right + diag_shift, either of which
    may then be negative), and a shifted call always takes the local kernels, the ones whose
    ALiBi reads the shift (kernels/score.cuh), also without a window."""
    if window_size.__class__ is tuple and window_size == (-1, -1) and not diag_shift:
        return causal, False, 0, 0  # (the default, at once)
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, (int, np.integer)) and not isinstance(w, (bool, np.bool_))
                       and w >= -1 for w in window_size)):
        raise ValueError(f"window_size must be a pair (left, right) of ints >= -1 (-1: "
                         f"unbounded), got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0
    if left < 0 and (right < 0 or causal) and not diag_shift:
        return causal, False, 0, 0
    if left < 0:  # (a left side no row reaches)
        left = seqlen_q + seqlen_k + max(diag_shift, 0)
    else:
        left -= diag_shift
    return right >= 0, True, left, (right + diag_shift if right >= 0 else 0)


def _hook(cupy, softcap, alibi_slopes, q, batch=None) -> tuple:
    """(hooked, softcap, slopes pointer, slopes batch stride) of a call's score hook
    (kernels/score.cuh): softcap a real number >= 0, finite in float32 (0: off); alibi_slopes
    None or a float32 CuPy array (nheads,) or (batch, nheads), C-contiguous, on q's GPU.
    cupy None: a trace-time check of metadata (cuflash.jax), no pointer."""
    if alibi_slopes is None and softcap.__class__ in (float, int) and softcap == 0:
        return False, 0.0, 0, 0  # (the default, at once)
    ok = isinstance(softcap, numbers.Real) and not isinstance(softcap, (bool, np.bool_))
    cap = float(softcap) if ok else math.nan
    with np.errstate(over="ignore"):
        as_f32 = np.float32(cap) if ok else np.float32(math.nan)
    if not (ok and math.isfinite(cap) and cap >= 0 and np.isfinite(as_f32)
            and (cap == 0 or as_f32 > 0)):
        raise ValueError(f"softcap must be a finite real number >= 0 (0: off), got {softcap!r}")
    if alibi_slopes is None:
        return cap > 0, cap, 0, 0
    nheads = q.shape[2]
    batch = q.shape[0] if batch is None else batch
    if cupy is None:  # (metadata only: cuflash.jax's checks at trace time)
        _check_slopes(alibi_slopes, nheads, batch)
        return True, cap, 0, 0
    _check_type(cupy, "alibi_slopes", alibi_slopes)
    _check_slopes(alibi_slopes, nheads, batch)
    if not alibi_slopes.flags.c_contiguous:
        raise ValueError("alibi_slopes must be C-contiguous")
    _check_device(cupy, {"q": q, "alibi_slopes": alibi_slopes})
    return True, cap, alibi_slopes.data.ptr, nheads if alibi_slopes.ndim == 2 else 0


def _check_slopes(alibi_slopes, nheads: int, batch: int) -> None:
    """alibi_slopes' dtype and shape (metadata only: cuflash.jax checks them at trace time)."""
    if alibi_slopes.dtype != np.float32 or tuple(alibi_slopes.shape) not in (
            (nheads,), (batch, nheads)):
        raise ValueError(f"alibi_slopes must be float32 of shape ({nheads},) or ({batch}, "
                         f"{nheads}), got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")


def _softcap_fields(cap: float, scale: float) -> dict:
    """The softcap as the kernels' two factors on the unscaled S (score.cuh): tanh(S scale /
    cap) times cap / scale; softcap_in = 0 turns it off. softcap_log2 = cap log2(e): the
    Hopper backward's exponent of tanh without ALiBi (the two factors of S's units and the
    scale's folded in)."""
    fields = {"softcap_in": scale / cap if cap > 0 else 0.0,
              "softcap_out": cap / scale if cap > 0 else 1.0,
              "softcap_log2": cap * _LOG2E if cap > 0 else 0.0}
    if not all(abs(x) <= _F32_MAX for x in fields.values()):
        raise ValueError(f"softcap={cap!r} with softmax_scale={scale!r}: the kernels' factors "
                         f"softcap / scale and softcap log2(e) must fit in float32; a softcap "
                         f"this large changes nothing (use softcap=0, off)")
    return fields


def _call_features(cupy, causal, window_size, softcap, alibi_slopes, q, batch, seqlen_q,
                   seqlen_k, d, scale, algorithm="fa2", diag_shift=0) -> tuple:
    """What a forward or backward call asks of the kernels beyond plain attention: (upper,
    local, hooked, odd_d, fields). upper, local: the mask, Mask<upper, local> (_window);
    hooked: the score hook (_hook); odd_d: a head dim that is not a multiple of 8 (the OddD
    kernels, which always have the window and the hook, _odd_d_features); fields: the window's
    and the hook's parameter fields, none for a plain call (the struct's defaults turn them
    off). algorithm "fa1" refuses each of them (FlashAttention-1's kernel has none).
    diag_shift: ring attention's blocks (_window; ALiBi reads it from the parameters)."""
    upper, local, left, right = _window(causal, window_size, seqlen_q, seqlen_k, diag_shift)
    if local and algorithm == "fa1":
        raise ValueError("window_size needs algorithm='fa2' (FlashAttention-1's kernel has no "
                         "sliding window)")
    hooked, cap, slopes, slopes_b = _hook(cupy, softcap, alibi_slopes, q, batch)
    if hooked and algorithm == "fa1":
        raise ValueError("softcap and alibi_slopes need algorithm='fa2' (FlashAttention-1's "
                         "kernel has no score hook)")
    odd_d = d % 8 != 0
    if odd_d:
        if algorithm == "fa1":
            raise ValueError(f"algorithm='fa1' needs a head dim that is a multiple of 8 (got "
                             f"{d}); algorithm='fa2' takes any head dim from 1 to "
                             f"{_plan.MAX_HEAD_DIM}")
        local, left, right, hooked = _odd_d_features(upper, local, left, right, seqlen_q,
                                                     seqlen_k)
    fields = dict(window_left=left, window_right=right, alibi_slopes=slopes,
                  alibi_stride_b=slopes_b, alibi_shift=float(diag_shift),
                  **_softcap_fields(cap, scale)) if local or hooked else {}
    return upper, local, hooked, odd_d, fields


def _check_qkv(q, k, v):
    """(cupy, device id, (strides, rows_aligned) as _check_shapes returns them)."""
    cupy = _cupy()
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_type(cupy, name, x)
    layout = _check_shapes(q, k, v)
    device_id = q.data.device_id
    if not device_id == k.data.device_id == v.data.device_id or device_id not in _capable_devices:
        device_id = _check_device(cupy, {"q": q, "k": k, "v": v})
    return cupy, device_id, layout


def _aligned_qkv(cupy, q, k, v, layout) -> tuple:
    """q, k, v with 16-byte aligned rows (see _aligned) and their strides (three 3-tuples).
    Head dims that are not a multiple of 8 take them as they are (the OddD kernels' loads go
    element by element)."""
    strides, rows_aligned = layout
    if rows_aligned and (q.data.ptr | k.data.ptr | v.data.ptr) % 16 == 0 or q.shape[-1] % 8:
        return q, k, v, strides
    q, k, v = (_aligned(cupy, x) for x in (q, k, v))
    return q, k, v, (_strides(q), _strides(k), _strides(v))


def _on_device(cupy, device_id: int):
    """A context making device_id the current device: none at all (no CUDA calls on entry and
    exit) when it already is."""
    return _SAME_DEVICE if cupy.cuda.runtime.getDevice() == device_id \
        else cupy.cuda.Device(device_id)


_SAME_DEVICE = contextlib.nullcontext()
_LOG2E = math.log2(math.e)
_F32_MAX = float(np.finfo(np.float32).max)


def _softmax_scale(softmax_scale, d: int) -> float:
    """The scale as a Python float: 1 / sqrt(d) by default; otherwise a real number (not a
    bool or a string) that is finite and positive, and stays finite and non-zero as the
    kernels' float32, also once multiplied by log2(e)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(d)
    ok = isinstance(softmax_scale, numbers.Real) and not isinstance(softmax_scale, (bool, np.bool_))
    scale = float(softmax_scale) if ok else math.nan
    with np.errstate(over="ignore"):
        as_f32 = (np.float32(scale), np.float32(scale * _LOG2E)) if ok else ()
    if not (ok and math.isfinite(scale) and scale > 0
            and all(np.isfinite(x) and x > 0 for x in as_f32)):
        raise ValueError(f"softmax_scale must be a finite positive real number that float32 "
                         f"holds (about 1.2e-38 to 2.3e38), got {softmax_scale!r}")
    return scale


def _strides(x) -> tuple:
    """(batch, seq, head) strides in elements, as the kernels' int64 arguments (CuPy passes
    Python ints as 64-bit integers)."""
    size = x.itemsize
    st = x.strides
    return (st[0] // size, st[1] // size, st[2] // size)


ALGORITHMS = ("fa2", "fa1")


def forward(q, k, v, causal: bool = False, softmax_scale: float | None = None, *,
            window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None, out=None, lse=None,
            algorithm: str = "fa2", verbose: bool = False):
    """FlashAttention-2 forward: ``out = softmax(softmax_scale * q k^T [+ causal mask]) v``.

    Parameters
    ----------
    q : cupy.ndarray, (batch, seqlen_q, nheads, headdim), float16 or bfloat16
    k, v : cupy.ndarray, (batch, seqlen_k, nheads_k, headdim), same dtype as q.
        ``nheads % nheads_k == 0``; query head h reads key/value head
        ``h // (nheads // nheads_k)`` (MQA / GQA). Any strides in whole elements with a
        contiguous last dim. headdim: 1 to 256 (a multiple of 8 runs fastest: others take
        element-wise loads, and on Hopper the portable kernels).
    causal : bool
        Mask aligned to the bottom-right corner: query i sees key j iff
        ``j <= i + seqlen_k - seqlen_q``. Rows that see no key get out = 0, lse = -inf.
    softmax_scale : float, default ``1 / sqrt(headdim)``; finite, positive, float32-representable
    window_size : (left, right), default (-1, -1)
        A sliding window (FlashAttention-2's convention): query i sees key j iff
        ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right``; -1 leaves a
        side unbounded; ``causal=True`` is ``right = 0``. Blocks outside every row's window are
        skipped. Not with ``algorithm="fa1"``.
    softcap : float, default 0 (off)
        ``S -> softcap * tanh(S / softcap)`` on the scaled scores ``S = softmax_scale q k^T``
        (Gemma 2). Not with ``algorithm="fa1"``.
    alibi_slopes : cupy.ndarray, float32, (nheads,) or (batch, nheads), optional
        ALiBi: ``S -> S - slope * |i + seqlen_k - seqlen_q - j|`` after the softcap, the slope
        of each query head (and batch entry). Not with ``algorithm="fa1"``.
    out, lse : optional preallocated outputs (shapes and dtypes as returned; ``out`` has a
        contiguous last dim, starts on a 16-byte boundary and has strides that are multiples
        of 8 elements (a 2-byte boundary and any strides where the head dim is not a multiple
        of 8), ``lse`` must be contiguous). Neither may share memory with q, k, v or with the
        other.
    algorithm : "fa2" (default) or "fa1": FlashAttention-1's loop order (K/V outer, Q inner,
        O/l/m round-tripping through HBM), for study and comparison; same outputs.
    verbose : bool, print the launch plan (block sizes and how they were chosen).

    On an H100/H200 (compute capability 9.0) the FA2 forward runs the Hopper kernel family
    (TMA, wgmma, warp specialisation; kernels/fa2_forward_sm90.cu) where TMA can describe q, k
    and v (16-byte aligned, strides multiples of 16 bytes); elsewhere, and inside
    ``with cuflash.portable_kernels():``, the portable mma.sync kernel. Both compute the same
    function to the same accuracy rule.

    Returns
    -------
    out : cupy.ndarray, (batch, seqlen_q, nheads, headdim), q's dtype
    lse : cupy.ndarray, (batch, nheads, seqlen_q), float32: the log-sum-exp L of each row of
        ``softmax_scale * q k^T`` (natural log), as the backward pass needs it. NaN in q or k
        gives NaN in both out and lse (never lse = -inf, which means "saw no key").

    Raises
    ------
    TypeError
        An argument is not a cupy.ndarray (a NumPy array gets a hint), a dtype other than
        float16/bfloat16 or dtypes that differ, a flag that is not a bool, an algorithm that is
        not a str.
    ValueError
        Shapes that do not match, an unsupported head dim, strides that are not whole elements
        or a last dim that is not contiguous, arrays on different GPUs, a bad softmax_scale or
        algorithm, a bad window_size, softcap or alibi_slopes (or one of them with
        ``algorithm="fa1"``), a misaligned or overlapping output buffer.
    RuntimeError
        A GPU older than sm_80.
    cuflash.KernelCompileError
        A kernel failed to compile (the message starts with ``file:line:``).

    Runs on CuPy's current stream, on the device that holds q.
    """
    return _forward(q, k, v, causal, softmax_scale, out, lse, algorithm, verbose, None,
                    window_size, softcap, alibi_slopes)


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                   causal: bool = False, softmax_scale: float | None = None, *,
                   window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None, out=None,
                   lse=None, check_cu_seqlens: bool = False, verbose: bool = False):
    """The FlashAttention-2 forward over a variable-length batch: sequences of different
    lengths packed back to back, no padding anywhere (FlashAttention-2's
    ``flash_attn_varlen_func`` layout).

    Parameters
    ----------
    q : cupy.ndarray, (total_q, nheads, headdim), float16 or bfloat16
    k, v : cupy.ndarray, (total_k, nheads_k, headdim), q's dtype (GQA/MQA as in ``forward``)
    cu_seqlens_q, cu_seqlens_k : the cumulative lengths, batch + 1 entries each: sequence b is
        rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b +
        1]`` of k and v, and attends within itself (zero-length sequences are allowed).
        Either host sequences (list, tuple, NumPy array), checked here (start at 0, never
        decrease, end at total_q / total_k) and copied to the GPU; or int32 CuPy arrays on
        q's GPU, which are trusted as they are (a wrong one makes the kernels read and write
        out of bounds) unless ``check_cu_seqlens=True`` copies them back and checks them
        (a synchronisation).
    max_seqlen_q, max_seqlen_k : int, the longest sequence's lengths (they size the grid).
        Optional with host cu_seqlens (computed; a value given must be at least the real
        longest length); required with device arrays, unless check_cu_seqlens.
    causal, softmax_scale, window_size, softcap : as in ``forward``; the masks are aligned to
        each sequence's own bottom-right corner.
    alibi_slopes : float32 CuPy array, (nheads,) or (batch, nheads), batch = the sequences.
    out, lse : optional preallocated outputs, (total_q, nheads, headdim) and (nheads, total_q)
        float32 (FlashAttention-2's varlen layout), with ``forward``'s rules.

    Returns
    -------
    out : cupy.ndarray, (total_q, nheads, headdim)
    lse : cupy.ndarray, (nheads, total_q), float32

    Raises: as ``forward``, and ValueError for cu_seqlens or max_seqlen that do not describe
    the packed arrays. Its backward: ``backward_varlen``.
    """
    cupy = _cupy()
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_type(cupy, name, x)
        _check_packed_rank(name, x)
    if out is not None:
        _check_type(cupy, "out", out)
        if out.ndim != 3:
            raise ValueError(f"out must be 3-D (total_q, heads, headdim), got {out.shape}")
    packed = _packed(cupy, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     _check_flag("check_cu_seqlens", check_cu_seqlens))
    # (1, total, heads, d) views: a batch of one, which the kernels address per entry
    q4, k4, v4 = q[None], k[None], v[None]
    out4 = None if out is None else out[None]
    out4, lse = _forward(q4, k4, v4, causal, softmax_scale, out4, lse, "fa2", verbose, None,
                         window_size, softcap, alibi_slopes, packed)
    return (out if out is not None else out4[0]), lse


def _check_packed_rank(name: str, x) -> None:
    if x.ndim != 3:
        raise ValueError(f"{name} must be 3-D (total, heads, headdim) for a variable-length "
                         f"batch, got shape {x.shape}")


def _check_cu_array(name: str, cu) -> None:
    """A device (or traced) cu_seqlens array's metadata: 1-D int32, batch + 1 >= 2 entries."""
    if cu.dtype != np.int32 or cu.ndim != 1 or cu.size < 2:
        raise ValueError(f"{name} on the GPU must be a 1-D int32 array of batch + 1 >= 2 "
                         f"entries, got {cu.dtype} shape {cu.shape}")


def _check_cu_sizes(size_q: int, size_k: int) -> int:
    """The batch of two cu_seqlens of these sizes."""
    if size_q != size_k:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), "
                         f"got {size_q} and {size_k}")
    batch = size_q - 1
    if batch > _GRID_YZ_MAX:
        raise ValueError(f"batch ({batch}) must be <= {_GRID_YZ_MAX}")
    return batch


def _max_seqlen(name: str, given, host) -> int:
    """max_seqlen_q / _k: the given value checked (an int >= 0, not below the longest of host
    cu_seqlens), or the longest of host cu_seqlens where none is given."""
    real = int(np.diff(host).max()) if host is not None else None
    if given is None:
        if real is None:
            raise ValueError(f"{name} is needed with cu_seqlens on the GPU (or pass "
                             "check_cu_seqlens=True, which reads them back)")
        given = real
    if not isinstance(given, (int, np.integer)) or isinstance(given, (bool, np.bool_)) \
            or given < 0:
        raise ValueError(f"{name} must be an int >= 0, got {given!r}")
    if real is not None and given < real:
        raise ValueError(f"{name} = {given} is less than the longest sequence ({real}): "
                         "its rows past that would be left out")
    return int(given)


class _Packed:
    """A variable-length batch as the kernels take it (seqinfo.cuh): the entries' number, the
    longest lengths, and the parameter fields (the cu_seqlens arrays' addresses, total_q). It
    holds the device copies of host cu_seqlens until the launch is queued."""

    def __init__(self, batch, max_seqlen_q, max_seqlen_k, cu_q, cu_k, total_q):
        self.batch, self.max_seqlen_q, self.max_seqlen_k = batch, max_seqlen_q, max_seqlen_k
        self.arrays = (cu_q, cu_k)
        self.fields = dict(cu_seqlens_q=cu_q.data.ptr, cu_seqlens_k=cu_k.data.ptr,
                           total_q=total_q)


def _packed(cupy, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            check) -> _Packed:
    """Check a variable-length batch's description against q (total_q, ...) and k (total_k,
    ...), see forward_varlen."""
    from .reference import check_cu_seqlens as _check_cu  # (NumPy only)

    total_q, total_k = q.shape[0], k.shape[0]
    if max(total_q, total_k) >= 2**31 - 256:
        raise ValueError("packed lengths (total_q, total_k) must be < 2**31 - 256")
    cus, on_device = {}, []
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, total_q),
                            ("cu_seqlens_k", cu_seqlens_k, total_k)):
        if isinstance(cu, cupy.ndarray):
            _check_cu_array(name, cu)
            if not cu.flags.c_contiguous:
                raise ValueError(f"{name} must be contiguous")
            _check_device(cupy, {"q": q, name: cu})
            host = _check_cu(cupy.asnumpy(cu), total, name) if check else None
            on_device.append(name)
            cus[name] = (cu, host)
        else:
            if isinstance(cu, (str, bytes)) or not hasattr(cu, "__len__"):
                raise TypeError(f"{name} must be a sequence of ints or an int32 cupy.ndarray, "
                                f"got {type(cu).__name__}")
            host = _check_cu(cu, total, name)
            cus[name] = (None, host)
    (cu_q, host_q), (cu_k, host_k) = cus["cu_seqlens_q"], cus["cu_seqlens_k"]
    batch = _check_cu_sizes(cu_q.size if cu_q is not None else host_q.size,
                            cu_k.size if cu_k is not None else host_k.size)
    maxes = [_max_seqlen("max_seqlen_q", max_seqlen_q, host_q),
             _max_seqlen("max_seqlen_k", max_seqlen_k, host_k)]
    if cu_q is None:
        cu_q = cupy.asarray(host_q.astype(np.int32))
    if cu_k is None:
        cu_k = cupy.asarray(host_k.astype(np.int32))
    return _Packed(batch, maxes[0], maxes[1], cu_q, cu_k, total_q)


def _forward_outputs(cupy, q, out, lse, lse_shape, odd_d: bool, inputs: dict) -> tuple:
    """(out, its (batch, seq, head) strides, lse) of a forward: new arrays, or the caller's,
    checked (shape, dtype, layout, alignment, no memory shared with each other or with
    `inputs`)."""
    given = {}
    if out is None:
        out = cupy.empty(q.shape, dtype=q.dtype)
        b, s, h, d = q.shape
        out_strides = (s * h * d, h * d, d)
    else:
        _check_given(cupy, "out", out, q.shape, q.dtype, q)
        _check_layout_once("out", out)
        _check_output_alignment("out", out, 2 if odd_d else 16)
        if not odd_d and _aligned(cupy, out) is not out:
            raise ValueError("out must start on a 16-byte boundary with strides that are "
                             "multiples of 8 elements")
        out_strides = _strides(out)
        given["out"] = out
    if lse is None:
        lse = cupy.empty(lse_shape, dtype=cupy.float32)
    else:
        _check_given(cupy, "lse", lse, lse_shape, np.float32, q, True)
        _check_output_alignment("lse", lse, 4)
        given["lse"] = lse
    if given:  # (a freshly allocated output overlaps nothing)
        _check_no_overlap(given, {n: x for n, x in inputs.items() if x is not None})
    return out, out_strides, lse


def _check_algorithm(algorithm) -> None:
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise (ValueError if isinstance(algorithm, str) else TypeError)(
            f"algorithm must be 'fa2' or 'fa1', got {algorithm!r}")


def _forward(q, k, v, causal, softmax_scale, out, lse, algorithm, verbose, config,
             window_size=(-1, -1), softcap=0.0, alibi_slopes=None, packed=None, diag_shift=0):
    """forward(), with an explicit tile shape (`config`, a _plan.ForwardConfig or None for the
    planner's choice): the bench's and the tests' tuning hook. packed: a variable-length
    batch (forward_varlen's _Packed; q, k, v, out are then (1, total, heads, d) views and lse
    is (heads, total_q)). diag_shift: the masks' and ALiBi's diagonal moved by that many keys
    (_window; ring attention's blocks)."""
    key = _repeat_key(q, k, v, causal, softmax_scale, out, lse, algorithm, verbose, config,
                      window_size, softcap, alibi_slopes, packed, diag_shift)
    key, done = _lookup(_repeats, key)  # a call like one before: its launch again, checked
    done = done and done.run(_cupy(), q, k, v, out, lse)
    if done:
        return done
    _check_algorithm(algorithm)
    causal = _check_flag("causal", causal)
    verbose = _check_flag("verbose", verbose)
    cupy, device_id, layout = _check_qkv(q, k, v)
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    lse_shape = (batch, nheads, seqlen_q)
    fields = {}  # the packed batch's fields (seqinfo.cuh), none when dense
    if packed is not None:  # the grid's sizes: the longest entry's, over the entries
        lse_shape = (nheads, seqlen_q)
        batch, seqlen_q, seqlen_k = packed.batch, packed.max_seqlen_q, packed.max_seqlen_k
        fields = packed.fields
    scale = _softmax_scale(softmax_scale, d)
    upper, local, hooked, odd_d, features = _call_features(
        cupy, causal, window_size, softcap, alibi_slopes, q, batch, seqlen_q, seqlen_k, d,
        scale, algorithm, diag_shift)
    features = {**features, **fields} if features else fields

    with _on_device(cupy, device_id):
        out, out_strides, lse = _forward_outputs(cupy, q, out, lse, lse_shape, odd_d,
                                                 {"q": q, "k": k, "v": v})
        if out.size == 0:
            return out, lse
        given = q, k, v
        q, k, v, qkv_strides = _aligned_qkv(cupy, q, k, v, layout)
        # (the launch is remembered for calls like this one where q, k, v were not copied)
        record = [] if key is not None and layout[1] and \
            all(x is y for x, y in zip((q, k, v), given)) else None
        HD = _plan.head_dim_bucket(d)
        if algorithm == "fa1":
            _forward_fa1(cupy, device_id, q, k, v, out, lse, causal, scale, HD, verbose,
                         qkv_strides, out_strides)
            return out, lse
        hopper_tile = isinstance(config, _plan.Sm90ForwardConfig)
        if hopper_tile and _capability(cupy, device_id) != 90:
            raise ValueError("a Hopper tile (bench notation hBcxStages) needs an sm_90 GPU")
        if odd_d and hopper_tile:
            raise ValueError(f"a Hopper tile needs a head dim that is a multiple of 8 (TMA's "
                             f"16-byte rows), got {d}")
        if odd_d and config is not None:  # (an explicit portable tile, in its OddD form)
            config = dataclasses.replace(config, odd_d=True)
        is_packed = packed is not None
        kind = (upper, local, hooked, is_packed)  # the mask, the score hook, the layout
        # (the Hopper family reads rows by TMA, in 16 bytes: head dims that are not a multiple
        # of 8 take the portable kernel)
        if (hopper_tile or config is None and not odd_d and _uses_sm90(cupy, device_id)) \
                and seqlen_k > 0 \
                and _forward_sm90(cupy, device_id, q, k, v, out, lse, kind, features, scale,
                                  verbose, qkv_strides, out_strides,
                                  config if hopper_tile else None,
                                  (batch, seqlen_q, seqlen_k), record):
            _remember(key, record, device_id, q, k, v, out, lse)
            return out, lse
        # The tile shape and compiled kernel for this (device, dtype, d, mask, hook, layout,
        # short keys or not), looked up once.
        short = not (local or hooked or is_packed) and _plan.forward_short(HD, upper, seqlen_k)
        plan, kernels, params = _prepared(
            _forward_launches, (device_id, q.dtype, d, kind, short, config),
            _registry.FA2_FORWARD,
            lambda: _registry.fa2_forward_plan(_dtype_name(q.dtype), HD, upper,
                                               _max_smem(cupy, device_id), seqlen_k, config,
                                               local, hooked, is_packed, odd_d))
        cfg, kernel = plan.cfg, kernels["main"]
        grid = _registry.fa2_forward_grid(cfg, seqlen_q, nheads, batch)
        if verbose:
            print(f"FA2 plan: B_r = {cfg.B_r}, B_c = {cfg.B_c}, {cfg.nwarps} warps, grid "
                  f"{grid} (row blocks, heads, batch), {cfg.smem_bytes} bytes of shared memory")
        qs, ks, vs = qkv_strides
        with params.lock:
            params.pack(q=q.data.ptr, k=k.data.ptr, v=v.data.ptr, o=out.data.ptr,
                        lse=lse.data.ptr, q_strides=qs, k_strides=ks, v_strides=vs,
                        o_strides=out_strides, seqlen_q=seqlen_q, seqlen_k=seqlen_k, d=d,
                        group=nheads // nheads_k, softmax_scale=scale,
                        scale_log2=scale * _LOG2E, **features)
            kernel(grid, cfg.threads, cfg.smem_bytes, cupy.cuda.get_current_stream().ptr,
                   params)
            if record is not None:
                record.append((kernel, grid, cfg.threads, cfg.smem_bytes, params,
                               bytes(params.buf), None, None))
        _remember(key, record, device_id, q, k, v, out, lse)
    return out, lse



# --- repeated calls ---------------------------------------------------------------------------
# A training or serving loop calls forward with the same few layouts and options every step.
# The first call of each takes the path above (every check, the plan, the parameter struct);
# its launch is remembered under the call's signature, and a later call with that signature
# checks only what can differ between such calls (the arrays' types, GPU, addresses: their
# alignment, and where out or lse are given, that nothing overlaps), then writes its addresses
# and tensor maps into the remembered struct and launches. Anything else takes the full path.
# The struct packed for a set of five addresses is kept too, and a call on addresses seen before
# launches it at once (_Repeat.filled): where out and lse are given (cuflash.jax's callbacks, a
# loop's own buffers), and where both are allocated, since CuPy's pool hands a caller that drops
# its outputs before the next call the same two blocks again.

def _repeat_key(q, k, v, causal, softmax_scale, out, lse, algorithm, verbose, config,
                window_size, softcap, alibi_slopes, packed, diag_shift=0):
    """The signature under which a dense forward call's launch is remembered: q's GPU, the
    layouts and dtypes of q, k, v, out and lse, each option with its type (causal=1 must not
    pass for True), portable_kernels(), _allocation_free(); None where the call is not one to
    remember (a varlen batch,
    ALiBi's per-call array, a tile or verbose output asked for, a ring block's shifted
    diagonal). Not hashed here: the caller's
    lookup hashes it, and takes a key that cannot be hashed (an unhashable option) for None,
    so that a call pays for one hash of the key, not two."""
    if packed is not None or alibi_slopes is not None or config is not None or diag_shift or \
            verbose is not False or type(algorithm) is not str or algorithm != "fa2" or \
            type(window_size) is not tuple:
        return None
    try:
        key = (q.data.device_id, type(q), q.shape, q.strides, q.dtype, type(k), k.shape,
               k.strides, k.dtype,
               type(v), v.shape, v.strides, v.dtype, type(causal), causal, type(softmax_scale),
               softmax_scale, tuple(map(type, window_size)), window_size, type(softcap), softcap,
               None if out is None else (type(out), out.shape, out.strides, out.dtype),
               None if lse is None else (type(lse), lse.shape, lse.strides, lse.dtype),
               _portable_only, _allocating_nothing())
    except Exception:  # (not arrays: the full path says what is wrong)
        return None
    return key


_U64 = struct.Struct("<Q")


def _member_offsets(params, names) -> tuple:
    """The byte offsets of the named members in a parameter struct (a repeat's addresses)."""
    at = {name: off for name, _, _, off in params.struct.members}
    return tuple(at[n] for n in names)


def _run_launches(params, launches, stream: int) -> None:
    """The kernels of `launches` ((kernel, grid, threads, shared memory, dependent) each, in
    order; _loader.Launcher) on the bytes packed in `params`, on the stream whose handle is
    given (their device current; the caller holds params.lock)."""
    for kernel, grid, threads, smem, dependent in launches:
        kernel(grid, threads, smem, stream, params, dependent)


def _launch_struct(params, filled, launches, stream: int) -> None:
    """_run_launches on the parameter bytes `filled` (a repeat's remembered struct)."""
    with params.lock:
        params.buf[:] = filled
        _run_launches(params, launches, stream)


def _with_addresses(template: bytes, offsets, addresses) -> bytearray:
    """A remembered parameter struct (its bytes) with these 64-bit addresses written at these
    offsets: what a repeated call launches (_Repeat here, _kvcache._DecodeRepeat)."""
    filled = bytearray(template)
    for off, address in zip(offsets, addresses):
        _U64.pack_into(filled, off, address)
    return filled


class _Repeat:
    """One remembered forward launch (see above)."""

    __slots__ = ("device_id", "kernel", "params", "template", "offsets", "tma", "out_shape",
                 "dtype", "lse_shape", "extents", "filled", "launches", "tail")

    def __init__(self, launch, device_id, q, k, v, out, lse):
        self.kernel, grid, threads, smem, self.params, self.template, self.tma, tail = launch
        # (a split tail's buffers, of these sizes, are the launching stream's: written in at
        # each launch)
        self.tail = None if tail is None else \
            (tail, _member_offsets(self.params, ("tail_parts", "tail_flags")))
        self.device_id, self.out_shape, self.dtype, self.lse_shape = \
            device_id, q.shape, q.dtype, lse.shape
        # (_launch_struct's: one launch, after whatever the stream ran before)
        self.launches = ((self.kernel, grid, threads, smem, False),)
        self.offsets = _member_offsets(self.params, ("q", "k", "v", "o", "lse") + (
            ("tm_q", "tm_k", "tm_v") if self.tma else ()))
        self.extents = tuple(_extent(x.shape, x.strides, x.itemsize) for x in (q, k, v, out, lse))
        # The parameter bytes of the last few launches by their five addresses: with the
        # layouts fixed by the key, what run() checks of the addresses (alignment, no overlap,
        # TMA can take them) and the bytes it packs depend on the addresses alone, so a call on
        # addresses seen before skips straight to its launch. Kept where out and lse are both
        # given or both allocated (a new allocation overlaps no live array).
        self.filled = {}

    def run(self, cupy, q, k, v, out, lse):
        """(out, lse) of the launch on these arrays, or None where this call needs the full
        path (an array that is not CuPy's, on another GPU, at an address the remembered launch
        does not allow, outputs that overlap, an address TMA cannot take)."""
        dev = self.device_id
        if not _on_gpu(cupy, (q, k, v, out, lse), dev):
            return None
        ptrs = [q.data.ptr, k.data.ptr, v.data.ptr]
        seen = None
        if out is not None and lse is not None:
            seen = (*ptrs, out.data.ptr, lse.data.ptr)
            with _on_device(cupy, dev):  # (these addresses passed every check below before)
                if self._launch_kept(cupy, seen):
                    return out, lse
        if (ptrs[0] | ptrs[1] | ptrs[2]) % 16 or out is not None and out.data.ptr % 16 or \
                lse is not None and lse.data.ptr % 4:
            return None
        if (out is not None or lse is not None) and self._overlap(q, k, v, out, lse):
            return None
        with _on_device(cupy, dev):
            fresh = out is None and lse is None
            if out is None:
                out = cupy.empty(self.out_shape, dtype=self.dtype)
            if lse is None:
                lse = cupy.empty(self.lse_shape, dtype=cupy.float32)
            if fresh:  # (the pool's blocks: often the last call's)
                seen = (*ptrs, out.data.ptr, lse.data.ptr)
                if self._launch_kept(cupy, seen):
                    return out, lse
            maps = ()
            if self.tma:
                maps = _tma.qkv_maps(q, k, v, *self.tma, bind=self.kernel.bind_thread)
                if maps is None:
                    return None
            offsets = self.offsets
            filled = _with_addresses(self.template, offsets, (*ptrs, out.data.ptr, lse.data.ptr))
            for off, m in zip(offsets[5:], maps):
                filled[off:off + len(m)] = m
            if seen is not None:
                if len(self.filled) >= 16:  # (a bound: a loop cycles through a few)
                    self.filled.clear()
                self.filled[seen] = filled = bytes(filled)
            if not self._launch(filled, cupy.cuda.get_current_stream().ptr):
                return None
        return out, lse

    def _launch(self, filled, stream: int) -> bool:
        """The kernel on the parameter bytes `filled`, on the stream whose handle is given
        (the launch's device current); False, launching nothing, where its split tail has no
        buffers to be had (_tail_buffers)."""
        if self.tail is not None:
            sizes, offsets = self.tail
            buffers = _tail_buffers(_cupy(), self.device_id, stream, sizes)
            if buffers is None:
                return False
            filled = _with_addresses(filled, offsets, buffers)
        _launch_struct(self.params, filled, self.launches, stream)
        return True

    def _launch_kept(self, cupy, seen) -> bool:
        """The bytes kept for the five addresses `seen`, launched on the current stream
        (the launch's device current); False where none are kept for them."""
        filled = self.filled.get(seen)
        return filled is not None and self._launch(filled, cupy.cuda.get_current_stream().ptr)

    def replay(self, filled, stream: int) -> bool:
        """Launch on `filled` (bytes that run() packed and kept for a set of addresses) and
        `stream`, with no check at all: for a caller that keeps them by those addresses
        (cuflash.jax's forward callback). False, launching nothing, where this thread's
        current CUDA context is not the launch's device's."""
        return self.kernel.is_current() and self._launch(filled, stream)

    def _overlap(self, q, k, v, out, lse) -> bool:
        """Whether a given output shares bytes with an input or with the other output
        (_check_no_overlap's rule, on the remembered extents)."""
        ranges = {i: (x.data.ptr + lo, x.data.ptr + hi)
                  for i, (x, (lo, hi)) in enumerate(zip((q, k, v, out, lse), self.extents))
                  if x is not None}
        return _overlapping(ranges, [i for i in (3, 4) if i in ranges]) is not None


_repeats: dict = {}


def _kept_forward(q, k, v, out, lse, causal, softmax_scale, window_size, softcap, algorithm):
    """The launch that forward() keeps for a call on these arrays with these options (out and
    lse given), as (_Repeat, its parameter bytes for these five addresses): what a caller
    that calls forward on the same addresses again and again can launch itself
    (_Repeat.replay). None where forward keeps none for them (yet: the bytes are kept from
    the second such call on; see _repeat_key and _Repeat.filled)."""
    _, rep = _lookup(_repeats, _repeat_key(q, k, v, causal, softmax_scale, out, lse, algorithm,
                                           False, None, window_size, softcap, None, None))
    filled = None if rep is None else \
        rep.filled.get((q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, lse.data.ptr))
    return None if filled is None else (rep, filled)


def _remember(key, record, device_id, q, k, v, out, lse) -> None:
    """Keep the launch that `record` holds under `key` (_repeat_key) for later calls."""
    if record:
        _keep(_repeats, key, _Repeat(record[0], device_id, q, k, v, out, lse))


_forward_launches: dict = {}


def _forward_sm90(cupy, device_id, q, k, v, out, lse, kind, features, scale, verbose,
                  qkv_strides, out_strides, config=None, sizes=None, record=None) -> bool:
    """The Hopper forward (kernels/fa2_forward_sm90.cu): TMA loads through tensor maps of q,
    k and v (cuflash/_tma.py, cached by address and layout), wgmma, warp specialisation.
    config: an explicit tile (the bench's), else the table's. Returns False, launching
    nothing, where TMA cannot describe q, k or v (the portable kernel runs instead). kind:
    (causal, local, hooked, packed), the kernel's mask, hook and batch layout; features: their
    parameter fields.
    sizes: (batch, seqlen_q, seqlen_k) of the grid where they are not q's and k's (packed
    batches: the entries' number and the longest lengths). record: a list
    to which the launch is appended (_remember)."""
    causal, local, hooked, packed = kind
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    if sizes is not None:
        batch, seqlen_q, seqlen_k = sizes
    dtype_name = _dtype_name(q.dtype)
    # the short-key tiles over a dense batch: by seqlen_k, or by a window's width
    if config is not None or packed:
        short = False
    elif local:
        short = _plan.sm90_window_short(d, causal, features["window_left"],
                                        features["window_right"], seqlen_k)
    else:
        short = _plan.sm90_forward_short(d, causal, seqlen_k)
    plan, kernels, params = _prepared(
        _forward_launches, ("sm90", device_id, q.dtype, d, kind, config, short),
        _registry.FA2_FORWARD_SM90,
        lambda: _registry.sm90_forward_plan(dtype_name, d, causal, config,
                                            seqlen_k=1 if short else None, local=local,
                                            hooked=hooked, packed=packed))
    cfg, kernel = plan.cfg, kernels["main"]
    tma = (qkv_strides, dtype_name, cfg.q_box_rows, cfg.B_c)  # (the maps' layout and boxes)
    maps = _tma.qkv_maps(q, k, v, *tma, bind=kernel.bind_thread)  # (needs the context current)
    if maps is None:
        return False
    tail_sizes = None  # (the split tail's buffer sizes, where it splits)
    walk = _NO_WALK  # (the tile walk's divisors: dense batches)
    if packed:  # tiles handed out in turn from a counter at zero (fa2_forward_sm90.cu)
        counter = cupy.zeros(1, dtype=np.int32)
        features = dict(features, tile_counter=counter.data.ptr)
        grid, per_unit = _registry.sm90_packed_grid(
            cfg, features["total_q"], nheads, batch,
            int(_device_properties(cupy, device_id)["multiProcessorCount"])), 1
    else:
        split_tail = not (causal or local or hooked or _allocating_nothing())
        causal_tail = causal and not local
        shape_key = (cfg, causal, seqlen_q, nheads, batch, device_id, seqlen_k, split_tail,
                     causal_tail)
        grid, per_unit, tail, walk = _sm90_grids.get(shape_key) or _sm90_grid(cupy, shape_key)
        if tail and causal_tail:  # (single tiles, no buffers: fa2_forward_sm90.cu)
            features = dict(features, tail_tiles=tail)
        elif tail:
            tail_sizes = _registry.sm90_tail_buffers(cfg, grid[0])
            buffers = _tail_buffers(cupy, device_id, cupy.cuda.get_current_stream().ptr,
                                    tail_sizes)
            if buffers:  # (the split tail's: fa2_forward_sm90.cu)
                features = dict(features, tail_tiles=tail, tail_parts=buffers[0],
                                tail_flags=buffers[1])
            else:  # (none to be had on a stream being captured: whole tiles, not kept)
                shape_key, record, tail_sizes = shape_key[:-2] + (False, False), None, None
                grid, per_unit, tail, walk = (_sm90_grids.get(shape_key)
                                              or _sm90_grid(cupy, shape_key))
    if verbose:
        print(f"FA2 Hopper plan (sm_90a: TMA, wgmma, 1 producer + {cfg.consumers} consumer "
              f"warpgroups): "
              f"B_r = {cfg.B_r}, B_c = {cfg.B_c}, {cfg.stages} K/V stages, head dim padded to "
              f"{cfg.HD}, persistent grid of {grid[0]} blocks over "
              + ("the packed batch's row blocks, handed out in turn, " if packed else
                 f"{-(-seqlen_q // cfg.B_r) * nheads * batch} tiles ({per_unit} per unit"
                 + (f"; the last {features['tail_tiles']} "
                    + ("units as single tiles, the longest first" if causal else
                       "split by column blocks") if features.get("tail_tiles") else "")
                 + "), ") +
              f"{cfg.smem_bytes} bytes of shared memory")
    qs, ks, vs = qkv_strides
    tm_q, tm_k, tm_v = maps
    with params.lock:
        params.pack(tm_q=tm_q, tm_k=tm_k, tm_v=tm_v, q=q.data.ptr, k=k.data.ptr,
                    v=v.data.ptr, o=out.data.ptr, lse=lse.data.ptr, q_strides=qs,
                    k_strides=ks, v_strides=vs, o_strides=out_strides, seqlen_q=seqlen_q,
                    seqlen_k=seqlen_k, d=d, group=nheads // k.shape[2],
                    softmax_scale=scale, scale_log2=scale * _LOG2E, nheads=nheads,
                    batch=batch, per_unit=per_unit, **walk, **features)
        kernel(grid, cfg.threads, cfg.smem_bytes, cupy.cuda.get_current_stream().ptr, params)
        if record is not None:
            record.append((kernel, grid, cfg.threads, cfg.smem_bytes, params, bytes(params.buf),
                           tma, tail_sizes))
    return True


_sm90_grids: dict = {}


_NO_WALK: dict = {}  # (packed batches take their tiles from a counter: the fields' defaults)


def _sm90_grid(cupy, shape_key: tuple):
    """(grid, per_unit, tail_tiles, walk) of a Hopper forward launch
    (_registry.sm90_forward_grid; walk: the tile walk's divisor fields for that per_unit,
    _registry.sm90_forward_walk) for shape_key = (cfg, causal, seqlen_q, nheads, batch,
    device_id, seqlen_k, split_tail, causal_tail), kept per shape: training loops launch the
    same few."""
    cfg, causal, seqlen_q, nheads, batch, device_id, seqlen_k, split_tail, causal_tail = \
        shape_key
    grid, per_unit, tail = _registry.sm90_forward_grid(
        cfg, causal, seqlen_q, nheads, batch,
        int(_device_properties(cupy, device_id)["multiProcessorCount"]), seqlen_k, split_tail,
        causal_tail)
    walk = _registry.sm90_forward_walk(cfg, seqlen_q, nheads, per_unit)
    return _keep(_sm90_grids, shape_key, (grid, per_unit, tail, walk))


# The split tails' buffers (fa2_forward_sm90.cu, fa2_backward_sm90.cu), per family, GPU and
# stream (and host thread, for the per-thread default stream, whose handle every thread
# shares): the parts in float32 (the backward's: sums, at zero between its launches) and the
# counts at zero, which each launch leaves at zero again. Launches on one stream run one
# after the other and can share them; another stream has its own. Grown where a launch needs
# more; at most _TAIL_STREAMS kept, the oldest let go. Letting go is safe with
# launches still queued: CuPy's pool hands a freed block out again only on the stream it
# was allocated on, behind them. A launch captured into a CUDA graph takes no split tail
# (_tail_buffers), so no graph holds these buffers.
_tail_kept: dict = {}
_TAIL_STREAMS = 16
_PER_THREAD_STREAM = 2  # cudaStreamPerThread


def _tail_buffers(cupy, device_id: int, stream: int, sizes: tuple,
                  family: str = "forward") -> tuple | None:
    """The addresses of a split-tail launch's float32 and int32 buffers on the stream whose
    handle is given (the device current); sizes: _registry.sm90_tail_buffers's (the
    forward's) or sm90_backward_tail_buffers's (family "backward": its own buffers, whose
    floats must be zero where the forward's are left dirty). None while the stream is being
    captured into a CUDA graph: buffers allocated then would have their zeroing held in the
    graph instead of run, and kept ones may be grown or let go (freed) while the graph still
    names them, or used by launches on the stream while a replay runs elsewhere."""
    if _capturing(cupy, stream):  # (None: the caller launches without its split tail)
        return None
    n_parts, n_flags = sizes
    key = (family, device_id, stream,
           threading.get_ident() if stream == _PER_THREAD_STREAM else None)
    kept = _tail_kept.get(key)
    if kept is None or kept[0].size < n_parts or kept[1].size < n_flags:
        if kept is not None:
            n_parts, n_flags = max(n_parts, kept[0].size), max(n_flags, kept[1].size)
            del _tail_kept[key]
        while len(_tail_kept) >= _TAIL_STREAMS:
            del _tail_kept[next(iter(_tail_kept))]
        # (allocated and zeroed on that stream, which may not be CuPy's current one: a
        # repeat's replay on a stream of its caller's)
        with contextlib.ExitStack() as on_stream:
            if stream != cupy.cuda.get_current_stream().ptr:
                on_stream.enter_context(cupy.cuda.ExternalStream(stream))
            kept = _tail_kept[key] = (cupy.zeros(n_parts, dtype=np.float32),
                                      cupy.zeros(n_flags, dtype=np.int32))
    return kept[0].data.ptr, kept[1].data.ptr


def _capturing(cupy, stream: int) -> bool:
    """Whether the stream whose handle is given is being captured into a CUDA graph (or the
    query fails, as it does for an invalidated capture: taken as capturing)."""
    query = getattr(cupy.cuda.runtime, "streamIsCapturing", None)
    try:
        return query is not None and bool(query(stream))
    except Exception:  # (CUDARuntimeError, RuntimeError: a capture gone wrong)
        return True


_portable_only = False

# Per host thread: whether calls are to allocate nothing of cuflash's own (cuflash.jax's
# callbacks, where XLA may be capturing the launches into a CUDA graph): the Hopper
# forward's split tail, whose buffers are allocated on a stream's first use, stays off.
_thread_state = threading.local()


def _allocating_nothing() -> bool:
    return getattr(_thread_state, "allocating_nothing", False)


@contextlib.contextmanager
def _allocation_free():
    """A context in which this thread's calls allocate nothing of cuflash's own (above)."""
    before = _allocating_nothing()
    _thread_state.allocating_nothing = True
    try:
        yield
    finally:
        _thread_state.allocating_nothing = before


@contextlib.contextmanager
def portable_kernels():
    """A context in which ``forward`` runs the portable mma.sync kernels (sm_80 and newer) on
    every GPU, also where the Hopper family would run (an H100/H200, sm_90): for tests and
    comparisons. Process-wide: it is not meant to be entered from several threads at once."""
    global _portable_only
    saved, _portable_only = _portable_only, True
    try:
        yield
    finally:
        _portable_only = saved


def _uses_sm90(cupy, device_id: int) -> bool:
    """Whether the forward takes the Hopper family on this device: compute capability 9.0
    (wgmma and setmaxnreg are sm_90a instructions) and portable_kernels() not in force."""
    return not _portable_only and _capability(cupy, device_id) == 90


def _forward_fa1(cupy, device_id, q, k, v, out, lse, causal, scale, HD, verbose,
                 qkv_strides, out_strides):
    """FlashAttention-1 (kernels/fa1_forward.cu): one thread block per (head, batch); O, l, m
    live in HBM (O as a float32 workspace) between inner steps; fa1_finalize writes out and
    L."""
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    plan, kernels, params = _prepared(
        _fa1_launches, (device_id, q.dtype, HD, causal), _registry.FA1_FORWARD,
        lambda: _registry.fa1_forward_plan(_dtype_name(q.dtype), HD, causal,
                                           _max_smem(cupy, device_id)))
    cfg, kernel, fin = plan.cfg, kernels["main"], kernels["finalize"]
    if verbose:
        print(cfg.describe(seqlen_q, seqlen_k))
    O = cupy.zeros((batch, nheads, seqlen_q, d), dtype=cupy.float32)     # O_i = 0
    l = cupy.zeros((batch, nheads, seqlen_q), dtype=cupy.float32)        # l_i = 0
    m = cupy.full((batch, nheads, seqlen_q), -np.inf, dtype=cupy.float32)  # m_i = -inf
    qs, ks, vs = qkv_strides
    stream = cupy.cuda.get_current_stream().ptr
    with params.lock:
        params.pack(q=q.data.ptr, k=k.data.ptr, v=v.data.ptr, o=out.data.ptr, lse=lse.data.ptr,
                    o_accum=O.data.ptr, l_accum=l.data.ptr, m_accum=m.data.ptr, q_strides=qs,
                    k_strides=ks, v_strides=vs, o_strides=out_strides, seqlen_q=seqlen_q,
                    seqlen_k=seqlen_k, d=d, group=nheads // nheads_k, softmax_scale=scale,
                    scale_log2=scale * _LOG2E)
        grids = _registry.fa1_forward_grids(seqlen_q, d, nheads, batch)
        kernel(grids["main"], cfg.threads, cfg.smem_bytes, stream, params)
        fin(grids["finalize"], 128, 0, stream, params)


_fa1_launches: dict = {}


def precompile(dtypes=("float16", "bfloat16"), head_dims=None, causal=(False, True),
               backward: bool = True, fa1: bool = False, max_workers: int = 8,
               windows: bool = False, varlen: bool = False, decode: bool = False) -> int:
    """Compile (or load from CuPy's cache) the kernels for the current device ahead of time,
    in parallel. Returns how many specialisations were prepared. decode: also
    forward_kvcache's kernels. windows: also the kernels
    with a sliding window or the score hook (softcap, ALiBi); varlen: also the kernels for
    variable-length batches (forward_varlen, backward_varlen), with every window and hook where
    windows is set too (otherwise each is compiled on its first use). head_dims that are not
    a multiple of 8 add their OddD kernels (which take every option).

    Raises
    ------
    RuntimeError
        No CUDA GPU is usable on this machine.
    cuflash.KernelCompileError
        A kernel failed to compile.
    """
    from concurrent.futures import ThreadPoolExecutor

    cupy = _cupy()
    _require_gpu(cupy)
    device_id = cupy.cuda.Device().id
    buckets = sorted({_plan.head_dim_bucket(d) for d in (head_dims or _plan.HEAD_DIM_BUCKETS)})
    max_smem = _max_smem(cupy, device_id)
    bulk = _has_bulk_copy(cupy, device_id)
    dtypes = [dt if isinstance(dt, str) else _dtype_name(dt) for dt in dtypes]
    variants = [v for v in _registry.VARIANTS
                if v not in (_registry.FA2_BACKWARD, _registry.FA2_BACKWARD_SM90) or backward
                if v is not _registry.FA1_FORWARD or fa1
                if v is not _registry.FA2_DECODE or decode
                if v not in _SM90_VARIANTS or _uses_sm90(cupy, device_id)]
    sm90_buckets = sorted({_plan.sm90_head_dim_bucket(b) for b in buckets})
    names = list(dict.fromkeys(
        (v.source, name, v.options) for v in variants for dt in dtypes
        for HD in (sm90_buckets if v in _SM90_VARIANTS else buckets)
        for c in causal
        for features in _precompile_features(v, windows, varlen,
                                             any(d % 8 for d in head_dims or ()))
        for plan in v.plans(dt, HD, c, max_smem, bulk, **features)
        for name in plan.kernels.values()))

    def build(item):
        with cupy.cuda.Device(device_id):
            _loader.get_kernel(*item)

    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        list(pool.map(build, names))
    return len(names)


_SM90_VARIANTS = (_registry.FA2_FORWARD_SM90, _registry.FA2_BACKWARD_SM90)


def _precompile_features(variant, windows: bool, varlen: bool, odd_d: bool = False) -> list:
    """The feature keyword sets (local, hooked, packed, odd_d) precompile builds for a
    variant; odd_d: a head dim that is not a multiple of 8 was asked for (its OddD kernels)."""
    kinds = [(False, False)] + ([(True, False), (False, True), (True, True)]
                                if windows and variant.features else [])
    layouts = [False] + ([True] if varlen and variant.packed else [])
    sets = [{key: True for key, on in (("local", lo), ("hooked", ho), ("packed", pk)) if on}
            for pk in layouts for lo, ho in kinds]
    if odd_d and variant.odd_d:
        sets += [dict(local=True, hooked=True, odd_d=True, **({"packed": True} if pk else {}))
                 for pk in layouts]
    return sets


def backward(dout, q, k, v, out, lse, causal: bool = False,
             softmax_scale: float | None = None, *, window_size=(-1, -1),
             softcap: float = 0.0, alibi_slopes=None, deterministic: bool = False, dq=None,
             dk=None, dv=None):
    """FlashAttention-2 backward: gradients of ``out = forward(q, k, v, ...)`` given ``dout``.

    Recomputes S and P block by block from q, k and the forward's ``lse`` (no N x N matrix is
    ever stored), with D = rowsum(dout * out).

    Parameters
    ----------
    dout : cupy.ndarray, the gradient of ``out``; q's shape and dtype
    q, k, v : the forward's inputs (same rules as :func:`forward`)
    out, lse : the forward's outputs
    causal, softmax_scale, window_size, softcap, alibi_slopes : as given to the forward
    deterministic : bool
        Bitwise-identical gradients on every run (dQ is summed in a fixed order instead of by
        racing atomics): on the H200, 0.97-1.14x the default's time with the portable
        backward, 0.92-1.14x with the Hopper backward (bf16 grid, session 16, PERFORMANCE.md).
    dq, dk, dv : optional preallocated outputs: C-contiguous, on a 16-byte boundary, sharing
        no memory with each other or with dout, q, k, v, out, lse.

    Returns
    -------
    dq, dk, dv : cupy.ndarrays shaped like q, k, v, in their dtype. With GQA/MQA, dk and dv are
        summed over the query heads that share each key/value head.

    Raises
    ------
    TypeError, ValueError, RuntimeError, cuflash.KernelCompileError
        As :func:`forward`, for these arguments; RuntimeError also where the head dim's tile
        needs more shared memory than the GPU has (head dims above 128 on 99 KB GPUs), and
        for ``deterministic=True`` without the causal mask on sm_90 past 65535 key blocks.
    """
    return _backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, dq, dk, dv,
                     None, window_size, softcap, alibi_slopes)


def backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                    max_seqlen_k=None, causal: bool = False,
                    softmax_scale: float | None = None, *, window_size=(-1, -1),
                    softcap: float = 0.0, alibi_slopes=None, deterministic: bool = False,
                    dq=None, dk=None, dv=None, check_cu_seqlens: bool = False):
    """The backward of ``forward_varlen``: dq, dk, dv of a packed, variable-length batch
    (q, dout, out: (total_q, heads, d); k, v: (total_k, heads_k, d); lse: (heads, total_q), as
    forward_varlen returns it), with forward_varlen's arguments and rules.

    The backward kernels take the packed batch as it is (PackedSeq, seqinfo.cuh): one launch
    set for the whole batch, no synchronisation. Their dQ workspace covers the entries' own
    rows (float32, about heads x total_q x the head-dim bucket). With deterministic=True each
    sequence runs the dense deterministic backward on its own rows instead (views of q, k, v;
    device cu_seqlens are read back to the host for that loop, a synchronisation).

    dq, dk, dv: optional preallocated outputs shaped like q, k, v, C-contiguous. Rows of keys
    that no query sees (a sequence with no queries) get zero gradients.
    """
    cupy = _cupy()
    for name, x in (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out)):
        _check_type(cupy, name, x)
        _check_packed_rank(name, x)
    packed = _packed(cupy, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     _check_flag("check_cu_seqlens", check_cu_seqlens))
    _check_type(cupy, "lse", lse)
    if tuple(lse.shape) != (q.shape[1], q.shape[0]) or lse.dtype != np.float32:
        raise ValueError(f"lse must be float32 of shape (heads, total_q) = "
                         f"{(q.shape[1], q.shape[0])}, as forward_varlen returns it, got "
                         f"{lse.dtype} {tuple(lse.shape)}")
    deterministic = _check_flag("deterministic", deterministic)
    if not deterministic:  # the packed kernels, one launch set (they check the options)
        one = [x[None] for x in (dout, q, k, v, out)]
        grads = _backward(*one, lse, causal, softmax_scale, False,
                          *(None if x is None else x[None] for x in (dq, dk, dv)), None,
                          window_size, softcap, alibi_slopes, packed)
        # the given arrays themselves (grads hold views of them, one entry long)
        return tuple(g[0] if x is None else x for g, x in zip(grads, (dq, dk, dv)))
    if alibi_slopes is not None:  # (checked against the packed batch once, before the loop)
        _hook(cupy, softcap, alibi_slopes, q[None], packed.batch)
    grads = []
    for name, x, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if x is None:
            x = cupy.zeros(like.shape, dtype=like.dtype)
        else:
            _check_given(cupy, name, x, like.shape, like.dtype, q, True)
            x.fill(0)
        grads.append(x)
    dq, dk, dv = grads
    cu_q, cu_k = (cupy.asnumpy(c) for c in packed.arrays)
    for b in range(packed.batch):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if qs.start == qs.stop or ks.start == ks.stop:
            continue  # (no query, or no key: zero gradients)
        slopes = None if alibi_slopes is None else \
            (alibi_slopes if alibi_slopes.ndim == 1 else alibi_slopes[b])
        one = [x[qs][None] for x in (dout, q)] + [x[ks][None] for x in (k, v)]
        _backward(*one, out[qs][None], cupy.ascontiguousarray(lse[:, qs])[None], causal,
                  softmax_scale, deterministic, dq[qs][None], dk[ks][None], dv[ks][None],
                  None, window_size, softcap, slopes)
    return dq, dk, dv


def _packed_dq_workspace(cupy, packed, cfg, nheads: int, total_q: int) -> tuple:
    """(dq_accum, fields) of a packed batch's backward: float32 dQ sums for the entries' own
    rows, zeroed. With dQ atomics, (heads, total_q, HD) rows; with bulk dQ, whole row blocks:
    (heads, ws_blocks) blocks of B_r x HD, entry b's from row_block_offsets[b], the prefix sum
    of ceil(len / B_r) over the entries before it (computed on the GPU from cu_seqlens_q, no
    synchronisation; ws_blocks = ceil(total_q / B_r) + batch bounds their total)."""
    if not cfg.dq_bulk:
        return cupy.zeros((nheads, total_q, cfg.HD), dtype=cupy.float32), {}
    cu_q = packed.arrays[0]
    blocks = (cu_q[1:] - cu_q[:-1] + (cfg.B_r - 1)) // cfg.B_r
    offsets = cupy.zeros(packed.batch + 1, dtype=cupy.int32)
    offsets[1:] = cupy.cumsum(blocks)
    ws_blocks = -(-total_q // cfg.B_r) + packed.batch
    dq_accum = cupy.zeros((nheads, ws_blocks * cfg.B_r, cfg.HD), dtype=cupy.float32)
    packed.workspace = offsets  # (kept alive until the launches are queued)
    return dq_accum, {"row_block_offsets": offsets.data.ptr, "ws_blocks": ws_blocks}


def _backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic, dq, dk, dv,
              config, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, packed=None,
              scratch=None, diag_shift=0):
    """backward(), with an explicit tile shape (`config`, a _plan.BackwardConfig or None for
    the planner's choice): the bench's and the tests' tuning hook. packed: a variable-length
    batch (backward_varlen's _Packed, not deterministic; dout, q, k, v, out and dq, dk, dv are
    then (1, total, heads, d) views, lse is (heads, total_q)). scratch: a uint8 CuPy array to
    carve the launches' scratch from instead of allocating it (cuflash.jax; its size:
    _backward_scratch_bytes). diag_shift: as _forward's."""
    causal = _check_flag("causal", causal)
    deterministic = _check_flag("deterministic", deterministic)
    cupy, device_id, layout = _check_qkv(q, k, v)
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    group = nheads // nheads_k
    for name, x in (("dout", dout), ("out", out)):
        _check_given(cupy, name, x, q.shape, q.dtype, q)
        _check_layout_once(name, x)
    fields, total_q = {}, 0  # the packed batch's fields (seqinfo.cuh), none when dense
    if packed is not None:  # the grid's and the workspaces' sizes: the longest entry's
        total_q = seqlen_q
        batch, seqlen_q, seqlen_k = packed.batch, packed.max_seqlen_q, packed.max_seqlen_k
        fields = packed.fields
        _check_given(cupy, "lse", lse, (nheads, total_q), np.float32, q, True)
    else:
        _check_given(cupy, "lse", lse, (batch, nheads, seqlen_q), np.float32, q, True)
    scale = _softmax_scale(softmax_scale, d)
    causal, local, hooked, odd_d, features = _call_features(
        cupy, causal, window_size, softcap, alibi_slopes, q, batch, seqlen_q, seqlen_k, d,
        scale, diag_shift=diag_shift)
    if odd_d and isinstance(config, _plan.BackwardConfig):
        config = dataclasses.replace(config, odd_d=True)

    with _on_device(cupy, device_id):
        grads, given = [], {}
        for name, x, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
            if x is None:
                x = cupy.empty(like.shape, dtype=like.dtype)
            else:
                _check_given(cupy, name, x, like.shape, like.dtype, q, True)
                _check_output_alignment(name, x, 2 if odd_d else 16)
                given[name] = x
            grads.append(x)
        dq, dk, dv = grads
        if given:  # (a freshly allocated output overlaps nothing)
            _check_no_overlap(given, {"dout": dout, "q": q, "k": k, "v": v, "out": out,
                                      "lse": lse})
        if batch == 0 or nheads == 0 or seqlen_q == 0 or seqlen_k == 0:
            for g in grads:  # no query or no key: every gradient is zero
                g.fill(0)
            return dq, dk, dv
        q, k, v, qkv_strides = _aligned_qkv(cupy, q, k, v, layout)
        if not odd_d:  # (OddD kernels read rows element by element, as they are)
            dout, out = _aligned(cupy, dout), _aligned(cupy, out)
        # The Hopper backward where it covers the call (fa2_backward_sm90.cu: d <= 128 and a
        # multiple of 8, dense or packed; softcap or ALiBi over a packed batch d <= 64), else
        # the portable one below.
        hopper_tile = isinstance(config, _plan.Sm90BackwardConfig)
        if (hopper_tile or config is None) and not odd_d and \
                _uses_sm90(cupy, device_id) and \
                _backward_sm90(cupy, device_id, dout, q, k, v, out, lse, dq, dk, dv,
                               (causal, local, deterministic, hooked), features, scale,
                               qkv_strides, config, scratch, packed):
            return dq, dk, dv
        if hopper_tile:
            raise ValueError(f"the Hopper backward tile {config} cannot run this call (it "
                             "needs an sm_90 GPU, d <= 128 and a multiple of 8, TMA-"
                             "describable q, k, v, dout, and for a packed batch d <= 64 with "
                             "softcap or ALiBi, neither deterministic=True nor a scratch arena)")
        # The tile shape and the three compiled kernels, looked up once per configuration.
        def make_plan():
            max_smem, bulk = _max_smem(cupy, device_id), _has_bulk_copy(cupy, device_id)
            HD = _plan.backward_head_dim_bucket(d)
            cfg = config or _plan.backward_config(HD, max_smem, bulk, local, hooked, odd_d,
                                                  packed is not None)
            return _registry.fa2_backward_plan(_dtype_name(q.dtype), HD, causal, max_smem,
                                               bulk, bool(deterministic and cfg.dq_bulk), cfg,
                                               local, hooked, packed=packed is not None)
        plan, kernels, params = _prepared(
            _backward_launches,
            (device_id, q.dtype, d, causal, local, hooked, deterministic, config,
             packed is not None),
            _registry.FA2_BACKWARD, make_plan)
        cfg, pre, main, fin = plan.cfg, kernels["pre"], kernels["main"], kernels["dq"]
        ordered = bool(deterministic and cfg.dq_bulk)
        stream = cupy.cuda.get_current_stream().ptr

        sms = _device_properties(cupy, device_id)["multiProcessorCount"]
        spec = _backward_scratch(cfg, deterministic, causal, batch, nheads, nheads_k, seqlen_q,
                                 seqlen_k, k.shape, sms, total_q if packed is not None else None)
        s_ = _scratch_arrays(cupy, spec, scratch)
        Dsum, dq_order = s_["D"], s_.get("dq_order")
        T_c, splits, parts = spec.T_c, spec.splits, spec.parts
        split = deterministic and not ordered
        if packed is None:
            dq_accum = s_["dq_accum"]
        else:  # compact (fa2_backward.cu): the entries' own rows, not the padded batch's
            dq_accum, ws = _packed_dq_workspace(cupy, packed, cfg, nheads, total_q)
            fields = {**fields, **ws}
        if parts > 1:  # float32 slices (parts, batch, seqlen_k, nheads_k, d), summed below
            dk_buf, dv_buf = s_["dk_parts"], s_["dv_parts"]
            dkv_strides = _strides(dk_buf[0])
        else:
            dk_buf, dv_buf, dkv_strides = dk, dv, _strides(dk)
        lanes = _preprocess_lanes(d)
        qs, ks, vs = qkv_strides
        with params.lock:  # one struct for the three kernels
            params.pack(q=q.data.ptr, k=k.data.ptr, v=v.data.ptr, o=out.data.ptr,
                        dout=dout.data.ptr, lse=lse.data.ptr, dsum=Dsum.data.ptr,
                        dq_accum=dq_accum.data.ptr,
                        dq_order=0 if dq_order is None else dq_order.data.ptr,
                        dq=dq.data.ptr, dk=dk_buf.data.ptr, dv=dv_buf.data.ptr,
                        q_strides=qs, k_strides=ks, v_strides=vs, o_strides=_strides(out),
                        do_strides=_strides(dout), dq_strides=_strides(dq),
                        dk_strides=dkv_strides, seqlen_q=seqlen_q, seqlen_k=seqlen_k, d=d,
                        group=group, nheads=nheads, head_parts=parts,
                        deterministic=int(deterministic), splits=splits,
                        dq_accum_cols=cfg.HD, lanes=lanes, softmax_scale=scale,
                        scale_log2=scale * _LOG2E, **features, **fields)
            # 1. D = rowsum(dO ∘ O)
            pre(_registry.backward_preprocess_grid(seqlen_q, lanes, nheads, batch), 128, 0,
                stream, params)
            # 2. dK, dV per column block; dQ accumulated in float32
            main(_registry.backward_grid(T_c, nheads_k * parts, batch, causal, ordered,
                                         splits if split else 0),
                 cfg.threads, cfg.smem_bytes, stream, params)
            # 3. dQ = scale * sum of the slices, in the input dtype
            fin(_registry.backward_dq_grid(cfg, seqlen_q, d, nheads, batch), 128, 0, stream,
                params)
        if parts > 1:  # (a fixed order: deterministic; into scratch: no allocation)
            for buf, g in ((dk_buf, dk), (dv_buf, dv)):
                cupy.sum(buf, axis=0, out=s_["dkv_sum"])
                g[...] = s_["dkv_sum"]
    return dq, dk, dv


def _preprocess_lanes(d: int) -> int:
    """The preprocess's lanes per query row (backward_passes.cuh): a power of two >= d / 8."""
    return 1 << max(0, (-(-d // 8) - 1).bit_length())


def _backward_sm90(cupy, device_id, dout, q, k, v, out, lse, dq, dk, dv, kind, features,
                   scale, qkv_strides, config=None, scratch=None, packed=None) -> bool:
    """The Hopper backward (kernels/fa2_backward_sm90.cu): the padded preprocess, the main
    kernel (TMA loads of q, k, v, dout through tensor maps, wgmma, warp specialisation), the
    dQ pass. kind: (causal, local, ordered, hooked), the kernel's mask, the deterministic mode
    and the score hook;
    features: the window's and the hook's parameter fields (none without them). config: an
    explicit Sm90BackwardConfig (the bench's), else the table's. packed: a variable-length
    batch (_backward's; (1, total, heads, d) views), the PackedSeq kernels. Returns False,
    launching nothing, where the head dim (with the hook: _plan.sm90_backward_buckets) takes
    the portable backward, TMA cannot describe q, k, v or dout, a packed batch comes
    with deterministic=True or a scratch arena, or a causal call has more column blocks than
    its grid's y dimension holds."""
    causal, local, ordered, hooked = kind
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    total_q, fields = None, {}
    if packed is not None:  # (1, total, heads, d) views; the grid: the longest entry's
        if ordered or scratch is not None:  # (entry by entry / the arena: portable)
            return False
        total_q = seqlen_q
        batch, seqlen_q, seqlen_k = packed.batch, packed.max_seqlen_q, packed.max_seqlen_k
        fields = packed.fields
    table = _plan.sm90_backward_config(d, local, ordered, hooked, packed is not None)
    cfg = config or table
    if table is None or cfg.HD != table.HD:  # (an explicit tile of another head-dim bucket:
        return False                          # its kernel would not fit d)
    dtype_name = _dtype_name(q.dtype)
    plan, kernels, params = _prepared(
        _backward_launches, ("sm90", device_id, q.dtype, d, kind, cfg, packed is not None),
        _registry.FA2_BACKWARD_SM90,
        lambda: _registry.sm90_backward_plan(dtype_name, d, causal, cfg, local, ordered,
                                             hooked, packed is not None))
    pre, main, fin = kernels["pre"], kernels["main"], kernels["dq"]
    qs, ks, vs = qkv_strides
    dos = _strides(dout)
    maps = _tma.maps((q, k, v, dout), (qs, ks, vs, dos), dtype_name,
                     (cfg.B_r, cfg.B_c, cfg.B_c, cfg.B_r), bind=main.bind_thread)
    if maps is None:
        return False
    tiles_kind = _registry.sm90_backward_tiles(causal, local, ordered, packed is not None)
    if tiles_kind == "by_column" and -(-seqlen_k // cfg.B_c) > _registry.GRID_YZ_MAX:
        return False  # (its grid holds the column blocks in y: the portable backward runs)
    sms = int(_device_properties(cupy, device_id)["multiProcessorCount"])
    grid = _registry.sm90_backward_grid(cfg, seqlen_k, nheads_k, batch, causal, ordered, sms,
                                        local, packed is not None)
    stream = cupy.cuda.get_current_stream().ptr
    tail = {"tail_whole": 0, "tail_parts": 1}
    if tiles_kind == "split":
        # a 1-d grid over the tiles, the last ones split by row steps where the last round of
        # blocks is part empty (fa2_backward_sm90.cu, the split tail; not where the call is
        # to allocate nothing: its buffers are the stream's, allocated on first use)
        tiles = grid[0] * grid[1] * grid[2]
        whole, parts = (tiles, 1) if scratch is not None or _allocating_nothing() else \
            _registry.sm90_backward_split(tiles, -(-seqlen_q // cfg.B_r) * (nheads // nheads_k),
                                          sms)
        buffers = parts > 1 and _tail_buffers(
            cupy, device_id, stream, _registry.sm90_backward_tail_buffers(cfg, whole, tiles),
            "backward")
        if not buffers:  # (none to be had on a stream being captured: whole tiles)
            whole, parts = tiles, 1
        grid = (whole + (tiles - whole) * parts, 1, 1)
        tail = {"tail_whole": whole, "tail_parts": parts}
        if buffers:
            tail["tail_acc"], tail["tail_flags"] = buffers
    s_ = _scratch_arrays(cupy, _sm90_backward_scratch(cfg, batch, nheads, nheads_k, seqlen_q,
                                                      ordered, total_q), scratch)
    if packed is None:
        dq_accum = s_["dq_accum"]
    else:  # the entries' own row blocks (_packed_dq_workspace), as D's and L log2 e's
        dq_accum, ws = _packed_dq_workspace(cupy, packed, cfg, nheads, total_q)
        fields = {**fields, **ws}
    lanes = _preprocess_lanes(d)
    rows = -(-seqlen_q // cfg.B_r) * cfg.B_r  # (the padded rows of D and L log2 e)
    tm_q, tm_k, tm_v, tm_do = maps
    with params.lock:  # one struct for the three kernels
        params.pack(tm_q=tm_q, tm_k=tm_k, tm_v=tm_v, tm_do=tm_do, q=q.data.ptr, k=k.data.ptr,
                    v=v.data.ptr, o=out.data.ptr, dout=dout.data.ptr, lse=lse.data.ptr,
                    dsum=s_["D"].data.ptr, lse_log2=s_["L2"].data.ptr,
                    dq_accum=dq_accum.data.ptr,
                    dq_order=s_["dq_order"].data.ptr if ordered else 0, dq=dq.data.ptr,
                    dk=dk.data.ptr,
                    dv=dv.data.ptr, q_strides=qs, k_strides=ks, v_strides=vs,
                    o_strides=_strides(out), do_strides=dos, dq_strides=_strides(dq),
                    dk_strides=_strides(dk), seqlen_q=seqlen_q, seqlen_k=seqlen_k, d=d,
                    group=nheads // nheads_k, nheads=nheads, head_parts=1,
                    deterministic=int(ordered),
                    splits=1, dq_accum_cols=cfg.HD, lanes=lanes, softmax_scale=scale,
                    scale_log2=scale * _LOG2E, **tail, **features, **fields)
        # 1. D = rowsum(dO ∘ O) and L log2(e), padded to whole row blocks
        pre(_registry.backward_preprocess_grid(rows, lanes, nheads, batch), 128, 0, stream,
            params)
        # 2. dK, dV per column block; dQ added into dQ_accum by bulk reductions
        # (dependent launches, sm_90: each may start while the one before ends; _loader.py)
        main(grid, cfg.threads, cfg.smem_bytes, stream, params, dependent=True)
        # 3. dQ = scale * dQ_accum, in the input dtype
        fin(_registry.backward_dq_grid(cfg, seqlen_q, d, nheads, batch), 128, 0, stream,
            params, dependent=True)
    return True


def _sm90_backward_scratch(cfg, batch, nheads, nheads_k, seqlen_q, ordered=False,
                           total_q=None) -> _Scratch:
    """The Hopper backward's scratch: D and L log2(e), float32 (batch, heads, rows), and the
    float32 dQ sums (batch, heads, rows, HD) in the kernel's fragment order, rows being
    seqlen_q rounded up to whole row blocks: zeroed by the preprocess (backward_passes.cuh),
    or (ordered, the deterministic mode, whose first addition into each row block is a store)
    not at all, with the zeroed turn counters
    (batch, heads, row blocks) and one ticket counter per (batch, kv head). A packed batch
    (total_q rows): D and L log2(e) (heads, ws_blocks x B_r), each entry's row blocks from
    its row_block_offsets, as its dQ sums (_packed_dq_workspace, not here)."""
    f32 = np.float32
    if total_q is not None:
        ws_rows = (-(-total_q // cfg.B_r) + batch) * cfg.B_r
        return _Scratch((("D", (nheads, ws_rows), f32, False),
                         ("L2", (nheads, ws_rows), f32, False)), 0, 1, 1)
    T_r = -(-seqlen_q // cfg.B_r)
    rows = T_r * cfg.B_r
    arrays = [("D", (batch, nheads, rows), f32, False),
              ("L2", (batch, nheads, rows), f32, False),
              ("dq_accum", (batch, nheads, rows, cfg.HD), f32, False)]  # (zeroed by the
    # preprocess, or, ordered, written first by a store)
    if ordered:
        arrays.append(("dq_order", (batch * nheads * T_r + batch * nheads_k,), np.int32, True))
    return _Scratch(tuple(arrays), 0, 1, 1)


@dataclasses.dataclass(frozen=True)
class _Scratch:
    """The float32 and int32 scratch of one backward call, in one place: `arrays` lists
    (name, shape, dtype, zeroed); the launch's split and part counts with it."""
    arrays: tuple
    T_c: int
    splits: int
    parts: int

    @property
    def nbytes(self) -> int:
        """The size of an arena holding every array (each on a 256-byte boundary)."""
        return sum(_round_up(math.prod(shape) * np.dtype(dt).itemsize, 256)
                   for _, shape, dt, _ in self.arrays)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _backward_scratch(cfg, deterministic, causal, batch, nheads, nheads_k, seqlen_q, seqlen_k,
                      k_shape, sms, total_q=None, bound=False) -> _Scratch:
    """What a backward launch needs besides its inputs and outputs. D = rowsum(dO ∘ O),
    float32 (batch, heads, seqlen_q); float32 dQ sums, with dq_bulk in whole row blocks, in the
    kernel's fragment order. Deterministic with dq_bulk ("ordered"): additions in a fixed order,
    counted in dq_order (the first one into each row block is a store: no zeroing needed);
    with atomics: one slice per split, summed in order afterwards (fa2_backward.cu,
    "Deterministic mode"). GQA / MQA: each block sums the query heads of one part of a group
    into dK_j, dV_j; more than one part only where one would leave SMs idle, then float32
    slices per part and their sum. total_q: a packed batch's (D as L, (heads, total_q); one
    part; its dQ sums are _packed_dq_workspace's, compact, not listed here). bound: sizes that
    hold for this batch and for any multiple of it folded into one (vmap): the most dQ slices
    and head parts the split and part choices could give, which only shrink as the batch
    grows."""
    group = nheads // nheads_k
    ordered = bool(deterministic and cfg.dq_bulk)
    T_c = (seqlen_k + cfg.B_c - 1) // cfg.B_c
    T_r = (seqlen_q + cfg.B_r - 1) // cfg.B_r
    rows = T_r * cfg.B_r if cfg.dq_bulk else seqlen_q
    split = deterministic and not ordered
    slice_bytes = batch * nheads * rows * cfg.HD * 4
    splits = _registry.deterministic_splits(sms, T_c, batch * nheads_k, cfg, seqlen_q * group,
                                            slice_bytes, causal) if split else 1
    if bound and split:  # (deterministic_splits' limit, which falls as slices grow)
        splits = max(2, min(16, -(-_registry.SPLIT_SCRATCH_FLOOR // slice_bytes)))
    parts = 1 if total_q is not None else \
        _registry.head_parts(group, (1 if split and bound else splits if split else T_c)
                             * nheads_k * batch, sms)
    f32, i32 = np.float32, np.int32
    arrays = [("D", (nheads, total_q) if total_q is not None else (batch, nheads, seqlen_q),
               f32, False)]
    if total_q is None:
        arrays.append(("dq_accum", (splits, batch, nheads, rows, cfg.HD), f32, not ordered))
    if ordered:  # turn counters (batch, heads, T_r), then one ticket per (batch, kv head part)
        arrays.append(("dq_order", (batch * nheads * T_r + batch * nheads_k * parts,), i32,
                       True))
    if parts > 1:
        arrays += [("dk_parts", (parts,) + tuple(k_shape), f32, False),
                   ("dv_parts", (parts,) + tuple(k_shape), f32, False),
                   ("dkv_sum", tuple(k_shape), f32, False)]
    return _Scratch(tuple(arrays), T_c, splits, parts)


def _backward_scratch_bytes(q_shape, k_shape, causal, window_size, softcap, alibi_slopes,
                            deterministic, device_id=None) -> int:
    """An arena size that `_backward(..., scratch=)` can carve for these shapes and options
    on a GPU (the current one by default), also with the batch multiplied (vmap folds its axes
    into the batch): cuflash.jax asks XLA for it as an output of the callback. alibi_slopes:
    None or metadata (shape, dtype)."""
    cupy = _cupy()
    if device_id is None:
        device_id = cupy.cuda.runtime.getDevice()
    batch, seqlen_q, nheads, d = q_shape
    seqlen_k, nheads_k = k_shape[1], k_shape[2]
    if batch == 0 or nheads == 0 or seqlen_q == 0 or seqlen_k == 0:
        return 0
    meta = types.SimpleNamespace(shape=tuple(q_shape))
    upper, local, hooked, odd_d, _ = _call_features(None, causal, window_size, softcap,
                                                    alibi_slopes, meta, batch, seqlen_q,
                                                    seqlen_k, d, 1.0)
    max_smem, bulk = _max_smem(cupy, device_id), _has_bulk_copy(cupy, device_id)
    cfg = _plan.backward_config(_plan.backward_head_dim_bucket(d), max_smem, bulk, local,
                                hooked, odd_d, False)
    sms = _device_properties(cupy, device_id)["multiProcessorCount"]
    portable = _backward_scratch(cfg, deterministic, upper, batch, nheads, nheads_k, seqlen_q,
                                 seqlen_k, k_shape, sms, bound=True).nbytes
    hopper = _plan.sm90_backward_config(d, hooked=hooked)  # (its scratch grows with the batch;
    # the same for every tile: B_r is 64 in all)
    if hopper is None or not _uses_sm90(cupy, device_id):
        return portable
    return max(portable, _sm90_backward_scratch(hopper, batch, nheads, nheads_k, seqlen_q,
                                                deterministic).nbytes)


def _scratch_arrays(cupy, spec: _Scratch, arena=None) -> dict:
    """The scratch arrays of `spec`: new ones from CuPy's pool, or views carved from `arena`
    (a uint8 CuPy array of at least spec.nbytes, e.g. a buffer XLA owns: no allocation, so
    that the launches can be captured in a CUDA graph); zeroed where the kernels need it."""
    out, offset = {}, 0
    if arena is not None and arena.nbytes < spec.nbytes:
        raise ValueError(f"the backward's scratch needs {spec.nbytes} bytes, got "
                         f"{arena.nbytes}")
    for name, shape, dtype, zeroed in spec.arrays:
        if arena is None:
            x = (cupy.zeros if zeroed else cupy.empty)(shape, dtype=dtype)
        else:
            n = math.prod(shape) * np.dtype(dtype).itemsize
            x = arena[offset:offset + n].view(dtype).reshape(shape)
            offset += _round_up(n, 256)
            if zeroed:
                x.fill(0)
        out[name] = x
    return out


_backward_launches: dict = {}

def attention_with_vjp(q, k, v, causal: bool = False, softmax_scale: float | None = None,
                       deterministic: bool = False, window_size=(-1, -1),
                       softcap: float = 0.0, alibi_slopes=None):
    """``out, vjp = attention_with_vjp(q, k, v)``; ``dq, dk, dv = vjp(dout)``.

    For custom autodiff code: the closure keeps only q, k, v, out and lse (the float32
    log-sum-exp, batch x heads x seqlen_q) as residuals; no N x N matrix is ever stored.
    The forward runs on the current stream; ``vjp`` may be called on any stream of the same
    device: it first makes that stream wait for the forward (a CUDA event), so it never reads
    out or lse before they are written.

    Raises
    ------
    As :func:`forward` and :func:`backward`.
    """
    deterministic = _check_flag("deterministic", deterministic)
    out, lse = forward(q, k, v, causal=causal, softmax_scale=softmax_scale,
                       window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    cupy = _cupy()
    with _on_device(cupy, q.data.device_id):
        written = cupy.cuda.Event(block=False, disable_timing=True)
        written.record()

    def vjp(dout):
        with _on_device(cupy, q.data.device_id):
            cupy.cuda.get_current_stream().wait_event(written)
        return backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
                        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                        deterministic=deterministic)

    return out, vjp


_properties: dict = {}


def _device_properties(cupy, device_id: int) -> dict:
    """cudaGetDeviceProperties, once per device (it is not free: launches must not pay it)."""
    if device_id not in _properties:
        _properties[device_id] = cupy.cuda.runtime.getDeviceProperties(device_id)
    return _properties[device_id]


def _max_smem(cupy, device_id: int) -> int:
    return int(_device_properties(cupy, device_id)["sharedMemPerBlockOptin"])


def _capability(cupy, device_id: int) -> int:
    """Compute capability as 10 major + minor (90 for an H100/H200)."""
    props = _device_properties(cupy, device_id)
    return 10 * int(props["major"]) + int(props["minor"])


def _has_bulk_copy(cupy, device_id: int) -> bool:
    return _plan.has_bulk_copy(_capability(cupy, device_id))


def _prepared(cache: dict, key, variant, make_plan):
    """(plan, {role: launcher}, parameter buffer) of a launch configuration, built on its first
    use (the plan from make_plan(), every kernel of the plan compiled, one ParamBuffer) and
    kept in `cache` under `key`: training loops call with the same few configurations."""
    entry = cache.get(key)
    if entry is None:
        plan = make_plan()
        entry = cache[key] = (plan, {role: _launcher(variant, plan, role)
                                     for role in plan.kernels},
                              _loader.ParamBuffer(variant.params))
    return entry


def _launcher(variant, plan, role: str):
    """The compiled kernel of `role` in a launch plan, with its shared-memory limit raised
    where it needs more than the default, ready to launch (current device)."""
    kernel = _loader.get_kernel(variant.source, plan.kernels[role], variant.options)
    if plan.smem[role]:
        _set_smem(kernel, plan.smem[role])
    return _loader.Launcher(kernel)


def _set_smem(kernel, nbytes: int) -> None:
    # The default limit is 48 KB less the kernel's static shared memory, so a tile of exactly
    # 48 KB beside a few static bytes needs it raised too.
    if kernel.max_dynamic_shared_size_bytes < nbytes:
        kernel.max_dynamic_shared_size_bytes = nbytes
