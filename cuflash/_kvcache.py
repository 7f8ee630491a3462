"""forward_kvcache: decoding against a KV cache (kernels/fa2_decode.cu). Validation, the split
choice and the launches; no kernel logic lives here."""

from __future__ import annotations

import numpy as np

from . import _api, _plan, _registry, reference

_launches: dict = {}


def _self_overlapping(shape: tuple, strides: tuple, itemsize: int) -> bool:
    """Whether two different elements of an array with these byte strides share an address
    (a broadcast view, stride 0, or strides that interleave): the axes of length > 1, sorted
    by stride, must each step past the whole extent of the ones before it."""
    axes = sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1)
    extent = itemsize
    for stride, n in axes:
        if stride < extent:
            return True
        extent = stride * n
    return False


def forward_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, block_table=None,
                    causal: bool = False, softmax_scale: float | None = None,
                    window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                    num_splits: int = 0, check_inputs: bool = False, out=None, lse=None):
    """Attention of new queries against a KV cache (FlashAttention-2's
    ``flash_attn_with_kvcache``): returns ``(out, lse)``, out like q, lse float32
    (batch, heads, seqlen_q).

    q: (batch, seqlen_q, heads, d), fp16 or bf16, d a multiple of 8 up to 256.
    k_cache, v_cache: (batch, capacity, heads_k, d), or paged (num_pages, page_size, heads_k,
    d) with ``block_table`` (batch, pages per entry) int32: key j of entry b is row
    j % page_size of page block_table[b, j // page_size]. heads must be a multiple of heads_k
    (GQA/MQA: the query heads of a KV head are computed together, K and V read once).
    cache_seqlens: keys already in each entry's cache, an int or (batch,) integers.
    k, v: optional new keys and values (batch, seqlen_new, heads_k, d), written into the cache
    in place at rows cache_seqlens[b] .. + seqlen_new - 1 before attending (cache_seqlens is
    not advanced: the caller does that). Entry b attends to its first cache_seqlens[b] +
    seqlen_new keys; causal and window masks are aligned bottom-right on that length (the
    queries are its last seqlen_q positions), as in FlashAttention-2.
    causal, softmax_scale, window_size, softcap, alibi_slopes: as in ``forward``.
    num_splits: splits of each entry's key range across thread blocks (FlashDecoding), their
    partial results combined exactly; 0 picks it from the GPU's SM count, batch, heads and
    the longest cache.

    cache_seqlens and block_table given as host sequences are checked on the host (the cache's
    capacity, the pages each entry uses in range; with cache_seqlens on the GPU, every page a
    host table names). CuPy arrays are trusted as they are (int32, contiguous): a wrong one
    reads or writes out of bounds. ``check_inputs=True`` checks them too (one copy to the
    host, a synchronisation). With k and v the caches are written in place: their rows must
    not share memory with each other or with q, k, v.
    out, lse: optional preallocated outputs, with ``forward``'s rules (sharing no memory
    with q, the caches, k or v).
    """
    return _forward_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal,
                            softmax_scale, window_size, softcap, alibi_slopes, num_splits,
                            check_inputs, out=out, lse=lse)


def _check_shapes(q, k_cache, v_cache, k, v, paged: bool) -> int:
    """The checks of forward_kvcache's arrays that need only their metadata (rank, dtype,
    layout, shapes; cuflash.jax runs them at trace time). Returns seqlen_new (0: no append).
    Layouts that passed are remembered: a serving loop calls with the same few every step."""
    key = (paged,) + tuple(None if x is None else (x.shape, x.strides, x.dtype)
                           for x in (q, k_cache, v_cache, k, v))
    seqlen_new = _layouts_ok.get(key)
    if seqlen_new is None:
        seqlen_new = _api._keep(_layouts_ok, key,
                                _check_shapes_uncached(q, k_cache, v_cache, k, v, paged))
    return seqlen_new


_layouts_ok: dict = {}


def _check_shapes_uncached(q, k_cache, v_cache, k, v, paged: bool) -> int:
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _api._check_layout(name, x)
    batch, seqlen_q, nheads, d = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"q, k_cache and v_cache must have the same dtype, got {q.dtype}, "
                        f"{k_cache.dtype}, {v_cache.dtype}")
    nheads_k = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache's head dim {k_cache.shape[3]} differs from q's {d}")
    if nheads_k == 0 or nheads % nheads_k:
        raise ValueError(f"q's {nheads} heads must be a multiple of the cache's {nheads_k}")
    if d % 8 or not 8 <= d <= _plan.MAX_HEAD_DIM:
        raise ValueError(f"forward_kvcache takes head dims that are multiples of 8 from 8 to "
                         f"{_plan.MAX_HEAD_DIM}, got {d}")
    if not paged and k_cache.shape[0] != batch:
        raise ValueError(f"a contiguous cache must hold one entry per batch entry of q: "
                         f"k_cache has {k_cache.shape[0]}, q {batch}")
    if (k is None) != (v is None):
        raise ValueError("give both k and v to append, or neither")
    if k is None:
        return 0
    for name, x in (("k", k), ("v", v)):
        _api._check_layout(name, x)
        if x.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, q {q.dtype}")
        if x.shape[0] != batch or x.shape[2:] != (nheads_k, d) or x.shape != k.shape:
            raise ValueError(f"k and v must be (batch={batch}, seqlen_new, "
                             f"heads_k={nheads_k}, d={d}), got {tuple(k.shape)} and "
                             f"{tuple(v.shape)}")
    return k.shape[1]


def _check_lengths_and_table(k_cache, cache_seqlens, block_table, seqlen_new: int,
                             batch: int, on_device, read_back=None) -> tuple:
    """cache_seqlens and block_table (None: a contiguous cache) checked as far as the host
    can: host values in full (reference.check_kvcache: capacity, the pages each entry uses),
    device arrays (on_device(x); CuPy's here, traced ones in cuflash.jax) by their metadata,
    and in full only where read_back(x) copies them to the host (check_inputs). With a host
    table and lengths on the device, every page the table names is checked. Returns
    (table_host, lens_host, capacity): the host copies or None, and each entry's key rows."""
    paged = block_table is not None
    table_host = None
    capacity = k_cache.shape[1]
    if paged:
        if on_device(block_table):
            if block_table.dtype != np.int32 or block_table.ndim != 2 or \
                    block_table.shape[0] != batch or not _contiguous(block_table):
                raise ValueError(f"block_table must be a C-contiguous int32 array (batch="
                                 f"{batch}, pages per entry), got {block_table.dtype} "
                                 f"{tuple(block_table.shape)}")
            table_host = read_back(block_table) if read_back else None
        else:
            table_host = np.asarray(block_table)
            if table_host.ndim != 2 or table_host.shape[0] != batch or \
                    not np.issubdtype(table_host.dtype, np.integer):
                raise ValueError(f"block_table must be integers (batch={batch}, pages per "
                                 f"entry), got {table_host.dtype} {table_host.shape}")
        if k_cache.shape[1] == 0:
            raise ValueError("a paged cache's pages must hold at least one key (k_cache "
                             "(num_pages, page_size, heads_k, d) with page_size 0)")
        capacity = k_cache.shape[1] * np.shape(block_table)[1]
    if on_device(cache_seqlens):
        if cache_seqlens.dtype != np.int32 or tuple(cache_seqlens.shape) != (batch,) or \
                not _contiguous(cache_seqlens):
            raise ValueError(f"cache_seqlens must be a contiguous int32 array ({batch},), got "
                             f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
        lens_host = read_back(cache_seqlens) if read_back else None
        # the lengths unknown here: every page a host table names must be in the cache
        if lens_host is None and table_host is not None and table_host.size and (
                table_host.min() < 0 or table_host.max() >= k_cache.shape[0]):
            raise ValueError(f"block_table names pages outside 0..{k_cache.shape[0] - 1} "
                             f"(with cache_seqlens on the GPU every entry is checked)")
    else:
        lens_host = cache_seqlens
    if lens_host is not None:  # (a trusted device block table: the capacity only)
        lens_host = reference.check_kvcache(k_cache, lens_host, seqlen_new, batch, table_host,
                                            capacity)
    return table_host, lens_host, capacity


def _contiguous(x) -> bool:
    flags = getattr(x, "flags", None)  # (a traced JAX array has none: XLA's are contiguous)
    return flags is None or flags.c_contiguous


def _check_num_splits(num_splits) -> None:
    if not isinstance(num_splits, (int, np.integer)) or isinstance(num_splits, bool) or \
            num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: chosen), got {num_splits!r}")


def _forward_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal,
                     softmax_scale, window_size, softcap, alibi_slopes, num_splits,
                     check_inputs, config=None, out=None, lse=None):
    """forward_kvcache, with an explicit tile (`config`, a _plan.DecodeConfig or None for the
    planner's): the tests' hook to run every tile of the table on one GPU."""
    cupy = _api._cupy()
    _api._require_gpu(cupy)
    key = _repeat_key(cupy, q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal,
                      softmax_scale, window_size, softcap, alibi_slopes, num_splits,
                      check_inputs, config, out, lse)
    key, rep = _api._lookup(_repeats, key)
    if rep is not None:
        got = rep.run(cupy, q, k_cache, v_cache, cache_seqlens, k, v, block_table)
        if got is not None:
            return got
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if x is not None:
            _api._check_type(cupy, name, x)
    paged = block_table is not None
    seqlen_new = _check_shapes(q, k_cache, v_cache, k, v, paged)
    batch, seqlen_q, nheads, d = q.shape
    nheads_k = k_cache.shape[2]
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):  # (written in place: no copy)
        if x.data.ptr % 16 or not _api._rows_aligned(x.shape, x.strides, x.itemsize):
            raise ValueError(f"{name} must start on a 16-byte boundary with strides that are "
                             f"multiples of 8 elements (it is written in place)")
    page_size = k_cache.shape[1] if paged else 0
    arrays = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if k is not None:
        arrays.update(k=k, v=v)

    # cache_seqlens and block_table: host values checked here, device arrays trusted
    on_device = lambda x: isinstance(x, cupy.ndarray)  # noqa: E731
    table_host, lens_host, capacity = _check_lengths_and_table(
        k_cache, cache_seqlens, block_table, seqlen_new, batch, on_device,
        cupy.asnumpy if check_inputs else None)
    for name, x in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        if on_device(x):
            arrays[name] = x
    device_id = _api._check_device(cupy, arrays)
    _check_num_splits(num_splits)

    scale = _api._softmax_scale(softmax_scale, d)
    upper, local, hooked, _, features = _api._call_features(
        cupy, causal, window_size, softcap, alibi_slopes, q, batch, seqlen_q, capacity, d,
        scale)
    group = nheads // nheads_k
    pack = 1 if alibi_slopes is not None or group == 0 else group  # (ALiBi: a bias per head)
    row_tiles = -(-(pack * seqlen_q) // 16)
    units = nheads // pack
    if units * row_tiles > _api._GRID_YZ_MAX or batch > _api._GRID_YZ_MAX:
        raise ValueError(f"forward_kvcache takes at most {_api._GRID_YZ_MAX} batch entries and "
                         f"{_api._GRID_YZ_MAX} tiles of 16 query rows per entry (heads x "
                         f"seqlen_q / 16); got batch {batch}, {units * row_tiles} tiles")
    if seqlen_new:  # (written in place: each cache row must be its own memory)
        for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
            if _self_overlapping(x.shape, x.strides, x.itemsize):
                raise ValueError(f"{name} has strides {x.strides} under which different "
                                 f"elements share memory; the append writes into it")
        _api._check_no_overlap({"k_cache": k_cache, "v_cache": v_cache},
                               {"q": q, "k": k, "v": v})

    with _api._on_device(cupy, device_id):
        out, _, lse = _api._forward_outputs(
            cupy, q, out, lse, (batch, nheads, seqlen_q), False,
            {"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v,
             "cache_seqlens": cache_seqlens if isinstance(cache_seqlens, cupy.ndarray) else None,
             "block_table": block_table if isinstance(block_table, cupy.ndarray) else None,
             "alibi_slopes": alibi_slopes})
        if batch == 0 or out.size == 0 and not seqlen_new:
            return out, lse
        if not isinstance(cache_seqlens, cupy.ndarray):
            cache_seqlens = cupy.asarray(np.asarray(lens_host, dtype=np.int32))
        if paged and not isinstance(block_table, cupy.ndarray):
            block_table = cupy.asarray(np.ascontiguousarray(table_host, dtype=np.int32))
        given = (q, k, v)
        q = _api._aligned(cupy, q)
        if k is not None:  # (the append copies 16 bytes at a time)
            k, v = _api._aligned(cupy, k), _api._aligned(cupy, v)
        # (no aligned copy: a repeat may pack the same; `is`, since CuPy's == is elementwise)
        as_given = all(x is y for x, y in zip((q, k, v), given))
        HD, max_smem = _plan.head_dim_bucket(d), _api._max_smem(cupy, device_id)

        def prepared(tile):  # (plan, kernels, params) of a tile (None: the table's)
            return _api._prepared(
                _launches, (device_id, q.dtype, d, upper, local, hooked, tile),
                _registry.FA2_DECODE,
                lambda: _registry.decode_plan(_api._dtype_name(q.dtype), HD, upper, max_smem,
                                              local, hooked, tile))
        plan, kernels, params = prepared(config)
        cfg = plan.cfg
        longest = capacity if lens_host is None else int(np.max(lens_host)) + seqlen_new
        sms = int(_api._device_properties(cupy, device_id)["multiProcessorCount"])
        if num_splits == 0:
            slots = sms * cfg.blocks_per_sm(max_smem)
            num_splits = _registry.decode_num_splits(batch, units, row_tiles, longest, slots,
                                                     cfg, paged)
        if config is None:  # (a launch that fills the GPU unsplit: the streaming tile)
            stream = _plan.decode_stream_config(cfg, batch * units * row_tiles, num_splits,
                                                longest, sms, paged, max_smem)
            if stream is not cfg:
                plan, kernels, params = prepared(stream)
                cfg = plan.cfg
        partial_rows = num_splits * batch * nheads * seqlen_q if num_splits > 1 else 0
        partials, partial = _split_partials(cupy, partial_rows, d)  # (kept through the launches)
        new = {}
        if k is not None and seqlen_new:
            new = {"k_new": k.data.ptr, "v_new": v.data.ptr, "kn_strides": _api._strides(k),
                   "vn_strides": _api._strides(v)}
        stream = cupy.cuda.get_current_stream().ptr
        with params.lock:
            params.pack(q=q.data.ptr, k=k_cache.data.ptr, v=v_cache.data.ptr,
                        o=out.data.ptr, lse=lse.data.ptr, cache_seqlens=cache_seqlens.data.ptr,
                        block_table=block_table.data.ptr if paged else 0,
                        q_strides=_api._strides(q), k_strides=_api._strides(k_cache),
                        v_strides=_api._strides(v_cache), o_strides=_api._strides(out),
                        kn_strides=new.pop("kn_strides", (0, 0, 0)),
                        vn_strides=new.pop("vn_strides", (0, 0, 0)),
                        seqlen_q=seqlen_q, seqlen_new=seqlen_new, d=d, group=group,
                        pack=pack, row_tiles=row_tiles, nheads=nheads, batch=batch,
                        num_splits=num_splits, page_size=page_size,
                        block_table_stride=block_table.shape[1] if paged else 0,
                        softmax_scale=scale, scale_log2=scale * _api._LOG2E,
                        **new, **partial, **features)
            # (kernel, grid, threads, shared memory, dependent), in order. Each kernel after
            # the first is launched as the one before's dependent (sm_90+: its launch overlaps
            # that one's end; it waits for that one's writes before touching memory).
            launches = []
            if seqlen_new:  # the new keys into the cache, then attend (one stream: in order)
                launches.append((kernels["append"], (seqlen_new, nheads_k, batch), 128, 0,
                                 False))
            if out.size:  # (else an append without queries)
                launches.append((kernels["main"],
                                 _registry.decode_grid(num_splits, units, row_tiles, batch),
                                 cfg.threads, cfg.smem_bytes, bool(launches)))
                if num_splits > 1:
                    launches.append((kernels["combine"],
                                     _registry.decode_combine_grid(batch, nheads * seqlen_q),
                                     128, 0, True))
            _api._run_launches(params, launches, stream)
            if key is not None and as_given and out.size and lens_host is None and \
                    table_host is None:  # (lengths and table on the GPU: nothing to check)
                _api._keep(_repeats, key, _DecodeRepeat(
                    device_id, launches, params, bytes(params.buf), out, lse, partial_rows, d))
    return out, lse


# --- repeated calls (a decode loop) -----------------------------------------------------------
# A serving loop calls forward_kvcache with the same layouts and options every step, lengths
# and block table on the GPU (trusted: nothing to check on the host). The first call of each
# signature takes the path above; its launches are remembered, and a later call with that
# signature checks what can differ between such calls (the arrays' types and GPU, their
# alignment, and with an append that the caches share no memory with q, k and v), allocates
# the outputs and the splits' partials, writes its addresses into the remembered struct and
# launches. Anything else takes the full path, which raises the usual errors.

_repeats: dict = {}


def _repeat_key(cupy, q, k_cache, v_cache, cache_seqlens, k, v, block_table, causal,
                softmax_scale, window_size, softcap, alibi_slopes, num_splits, check_inputs,
                config, out, lse):
    """The signature under which a call's launches are remembered (q's GPU, the layouts and
    dtypes of every array, each option with its type), or None for a call that is not
    remembered: lengths or block table from the host (checked every call), ALiBi's slopes, a
    tile asked for, given outputs, check_inputs. Not hashed here (the caller's lookup)."""
    if alibi_slopes is not None or config is not None or check_inputs is not False or \
            out is not None or lse is not None or type(window_size) is not tuple or \
            type(cache_seqlens) is not cupy.ndarray or \
            block_table is not None and type(block_table) is not cupy.ndarray:
        return None
    try:
        return (q.data.device_id, type(q), q.shape, q.strides, q.dtype) + tuple(
            None if x is None else (type(x), x.shape, x.strides, x.dtype)
            for x in (k_cache, v_cache, k, v, cache_seqlens, block_table)) + (
            type(causal), causal, type(softmax_scale), softmax_scale,
            tuple(map(type, window_size)), window_size, type(softcap), softcap,
            type(num_splits), num_splits)
    except Exception:  # (not arrays: the full path says what is wrong)
        return None


class _DecodeRepeat:
    """One remembered forward_kvcache call (see above)."""

    __slots__ = ("device_id", "launches", "params", "template", "offsets", "out_shape",
                 "dtype", "lse_shape", "partial_rows", "d")

    def __init__(self, device_id, launches, params, template, out, lse, partial_rows, d):
        self.device_id, self.launches, self.params, self.template = \
            device_id, tuple(launches), params, template
        self.offsets = _api._member_offsets(params, (
            "q", "k", "v", "o", "lse", "cache_seqlens", "block_table", "k_new", "v_new",
            "o_partial", "lse_partial"))
        self.out_shape, self.dtype, self.lse_shape = out.shape, out.dtype, lse.shape
        self.partial_rows, self.d = partial_rows, d  # (splits x query rows; 0: one split)

    def run(self, cupy, q, k_cache, v_cache, cache_seqlens, k, v, block_table):
        """(out, lse) of the remembered launches on these arrays, or None where the call
        needs the full path (an array that is not CuPy's or on another GPU, an address off
        its 16-byte grid, an append whose caches share memory with q, k or v)."""
        dev = self.device_id
        if not _api._on_gpu(cupy, (q, k_cache, v_cache, cache_seqlens, block_table, k, v), dev):
            return None
        ptrs = [q.data.ptr, k_cache.data.ptr, v_cache.data.ptr]
        append = k is not None and k.shape[1] > 0
        if append:
            ptrs += [k.data.ptr, v.data.ptr]
        if any(ptr % 16 for ptr in ptrs):
            return None
        if append:  # (it writes the caches: the full path's test, as a bool)
            try:
                _api._check_no_overlap({"k_cache": k_cache, "v_cache": v_cache},
                                       {"q": q, "k": k, "v": v})
            except ValueError:
                return None
        with _api._on_device(cupy, dev):
            out = cupy.empty(self.out_shape, dtype=self.dtype)
            lse = cupy.empty(self.lse_shape, dtype=cupy.float32)
            partials, partial = _split_partials(cupy, self.partial_rows, self.d)
            values = (ptrs[0], ptrs[1], ptrs[2], out.data.ptr, lse.data.ptr,
                      cache_seqlens.data.ptr, 0 if block_table is None else block_table.data.ptr,
                      ptrs[3] if append else 0, ptrs[4] if append else 0,
                      partial.get("o_partial", 0), partial.get("lse_partial", 0))
            _api._launch_struct(self.params,
                                _api._with_addresses(self.template, self.offsets, values),
                                self.launches, cupy.cuda.get_current_stream().ptr)
        return out, lse


def _split_partials(cupy, rows: int, d: int) -> tuple:
    """The splits' float32 partials for `rows` (splits x query rows; 0: one split, none) in
    one allocation, O_s (rows, d) then L_s (rows): (the array, to keep until the launches are
    queued, and its addresses as DecodeParams' o_partial and lse_partial)."""
    if not rows:
        return None, {}
    block = cupy.empty(rows * (d + 1), dtype=cupy.float32)
    return block, {"o_partial": block.data.ptr, "lse_partial": block.data.ptr + 4 * rows * d}
