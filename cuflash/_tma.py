"""TMA tensor maps for the Hopper kernels, encoded by the CUDA driver and cached.

A Hopper kernel's loads go through tensor maps (``CUtensorMap``, 128 opaque bytes) that the
driver's ``cuTensorMapEncodeTiled`` writes on the host. cuflash calls that driver function
through ctypes (``libcuda``, which every CUDA program has loaded), so no binding package is
needed. Encoding costs a few microseconds; ``qkv_maps`` keeps the maps of the last thousand
distinct calls (addresses, layouts, boxes), so that a training loop that reuses its buffers
encodes each once and looks them up with one dictionary access per call.

Q, K and V (batch, seqlen, heads, d) are described as 4-d tensors (d, seqlen, heads, batch),
innermost first, with boxes of 64 head-dim columns x ``rows`` rows, written to shared memory
with the 128-byte swizzle (hopper.cuh reads that layout). Coordinates past an end are filled
with zeros, which is how odd sequence lengths and head dims below the padded 64 are handled.
"""

from __future__ import annotations

import ctypes
import threading

# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion (cuda.h)
_DATA_TYPE = {"float16": 6, "bfloat16": 9}
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_INTERLEAVE_NONE = 0
_OOB_FILL_ZEROS = 0
MAP_BYTES = 128
BOX_COLUMNS = 64          # head-dim columns per box: 128 bytes, the swizzle's row

_encode = None
_lock = threading.Lock()
_cache: dict = {}
_CACHE_MAX = 1024


def _encoder():
    global _encode
    if _encode is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                       u64p, u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int]
        _encode = fn
    return _encode


def usable(ptr: int, shape: tuple, strides: tuple, itemsize: int) -> bool:
    """Whether TMA can describe a (batch, seqlen, heads, d) array at `ptr` with element
    strides (batch, seq, head) (the last dim contiguous): a 16-byte aligned start, and every
    stride of an axis longer than 1 a multiple of 16 bytes below 2^40 bytes."""
    if ptr % 16:
        return False
    return all(n == 1 or (s * itemsize) % 16 == 0 and 0 < s * itemsize < 1 << 40
               for n, s in zip(shape[:3], strides))


def qkv_maps(q, k, v, strides: tuple, dtype_name: str, q_rows: int, B_c: int, bind=None):
    """The tensor maps of q (boxes of q_rows rows), k and v (B_c rows), with (batch, seq, head)
    element strides `strides` (three 3-tuples); None where TMA cannot describe one of them
    (see `usable`). Cached by addresses, shapes, strides and boxes. `bind`: called before
    encoding (the driver needs a context current on this thread), not on a cache hit."""
    key = (q.data.ptr, k.data.ptr, v.data.ptr, q.shape, k.shape, strides, dtype_name, q_rows,
           B_c)
    found = _cache.get(key, False)  # (the forward's key, built inline: its host path is hot)
    if found is not False:
        return found
    return _encoded(key, (q, k, v), strides, dtype_name, (q_rows, B_c, B_c), bind)


def maps(arrays: tuple, strides: tuple, dtype_name: str, rows: tuple, bind=None):
    """The tensor maps of `arrays` ((batch, seqlen, heads, d) each, element strides `strides`,
    boxes of 64 columns x rows[i] rows), or None where TMA cannot describe one of them; cached
    and bound as in qkv_maps."""
    key = (tuple(x.data.ptr for x in arrays), tuple(x.shape for x in arrays), strides,
           dtype_name, rows)
    found = _cache.get(key, False)
    if found is not False:
        return found
    return _encoded(key, arrays, strides, dtype_name, rows, bind)


def _encoded(key, arrays, strides, dtype_name, rows, bind):
    """The maps of a cache miss (None where one array is not `usable`), kept under `key`."""
    out = None
    if all(usable(x.data.ptr, x.shape, s, x.itemsize) for x, s in zip(arrays, strides)):
        if bind is not None:
            bind()
        out = tuple(tensor_map(x.data.ptr, dtype_name, x.shape, s, r)
                    for x, s, r in zip(arrays, strides, rows))
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[key] = out
    return out


def tensor_map(ptr: int, dtype_name: str, shape: tuple, strides: tuple, rows: int) -> bytes:
    """The 128-byte tensor map of a (batch, seqlen, heads, d) array at `ptr` (element strides
    (batch, seq, head), last dim contiguous) read in boxes of 64 columns x `rows` rows.
    Raises RuntimeError when the driver refuses it (check `usable` first)."""
    batch, seqlen, heads, d = shape
    itemsize = 2
    # an axis of length 1 may carry any stride: give TMA a valid one
    sb, ss, sh = (s if n > 1 else 16 // itemsize for n, s in zip((batch, seqlen, heads),
                                                                   strides))
    dims = (ctypes.c_uint64 * 4)(d, seqlen, heads, batch)
    byte_strides = (ctypes.c_uint64 * 3)(ss * itemsize, sh * itemsize, sb * itemsize)
    box = (ctypes.c_uint32 * 4)(BOX_COLUMNS, rows, 1, 1)
    elem = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    out = ctypes.create_string_buffer(MAP_BYTES + 64)
    addr = (ctypes.addressof(out) + 63) // 64 * 64  # CUtensorMap is 64-byte aligned
    with _lock:
        rc = _encoder()(addr, _DATA_TYPE[dtype_name], 4, ptr, dims, byte_strides, box, elem,
                        _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for shape {shape}, "
                           f"strides {strides}, box rows {rows}")
    return ctypes.string_at(addr, MAP_BYTES)
