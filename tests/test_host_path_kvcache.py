"""CPU: forward_kvcache's host path with test_host_path's stand-in for CuPy and the driver:
the checks of its inputs, the split choice, and each launch (append, split attention, combine)
with its grid, shared memory and every field of DecodeParams packed."""

import ml_dtypes
import numpy as np
import pytest
from test_host_path import FakeArray, fake  # noqa: F401  (the fixture)

from cuflash import _kvcache, _plan, reference

BF16 = ml_dtypes.bfloat16


@pytest.fixture
def launches(fake, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_kvcache, "_launches", {})
    monkeypatch.setattr(_kvcache, "_repeats", {})
    return fake


def _arrays(batch, sq, h, hk, d, cap, pages=None, page=None, new=0):
    rng = np.random.default_rng(0)
    cache_shape = (pages, page, hk, d) if page else (batch, cap, hk, d)
    arrays = [FakeArray(rng.standard_normal(s).astype(BF16))
              for s in ((batch, sq, h, d), cache_shape, cache_shape)]
    if new:
        arrays += [FakeArray(rng.standard_normal((batch, new, hk, d)).astype(BF16))
                   for _ in range(2)]
    return arrays


def test_gqa_decode_splits_and_combines(launches):
    q, kc, vc = _arrays(3, 1, 32, 8, 128, 4096)
    out, lse = _kvcache.forward_kvcache(q, kc, vc, [5, 100, 4000])
    cfg = _plan.decode_config(128, 227 * 1024)
    splits = reference.num_splits_for(3, 8, 1, 4000, 132, cfg.B_c, cfg.nwarps)
    assert splits > 1
    (main, grid, block, smem, p), (comb, cgrid, cblock, _, cp_) = launches
    names = _plan.decode_kernel_names("bfloat16", cfg, False)
    assert (main, comb) == (names["main"], names["combine"])
    assert grid == (splits, 8, 3) and block == cfg.threads and smem == cfg.smem_bytes
    assert cgrid == (-(-32 // 4), 3, 1) and cblock == 128  # (rows of an entry, entries)
    assert (p["pack"], p["row_tiles"], p["group"], p["nheads"], p["batch"]) == (4, 1, 4, 32, 3)
    assert (p["num_splits"], p["seqlen_q"], p["seqlen_new"], p["d"]) == (splits, 1, 0, 128)
    assert (p["q"], p["k"], p["v"], p["o"], p["lse"]) == \
        (q.data.ptr, kc.data.ptr, vc.data.ptr, out.data.ptr, lse.data.ptr)
    assert p["o_partial"] and p["lse_partial"] and p["block_table"] == 0
    assert p["k_stride_b"] == 4096 * 8 * 128 and p["k_stride_s"] == 8 * 128
    assert cp_ == p and lse.shape == (3, 32, 1) and out.shape == q.shape


def test_split_choice_counts_the_tiles_an_sm_holds(launches):
    """num_splits=0 fills SMs x thread blocks per SM: a tile of which two fit an SM (by shared
    memory and by 255 registers a thread) gets the splits of a GPU with twice the SMs."""
    big = _plan.decode_config(128, 227 * 1024)
    small = _plan.DecodeConfig(128, 16, 4, 3)
    assert big.blocks_per_sm(227 * 1024) == 1 and small.blocks_per_sm(227 * 1024) == 2
    assert _plan.DecodeConfig(128, 16, 8, 3).blocks_per_sm(227 * 1024) == 1  # (registers)
    q, kc, vc = _arrays(1, 1, 32, 8, 128, 8192)
    for cfg, slots in ((big, 132), (small, 264)):
        launches.clear()
        _kvcache._forward_kvcache(q, kc, vc, [8000], None, None, None, False, None, (-1, -1),
                                  0.0, None, 0, False, cfg)
        splits = reference.num_splits_for(1, 8, 1, 8000, slots, cfg.B_c, cfg.nwarps)
        assert launches[0][1] == (splits, 8, 1)
    assert reference.num_splits_for(1, 8, 1, 8000, 264, 16) > \
        reference.num_splits_for(1, 8, 1, 8000, 132, 16)


def test_launches_that_fill_the_gpu_unsplit_take_the_streaming_tile(launches):
    """_plan.DECODE_STREAM: one split whose thread blocks fill 80% of the 132 SMs, over
    contiguous caches of 8192 keys or more, takes the tile with one K/V buffer less per warp;
    fewer blocks, a shorter cache, a paged one, a given split count above 1 or an explicit tile
    keep the table's."""
    table = _plan.decode_config(128, 227 * 1024)
    stream = _plan.DECODE_STREAM[table]
    assert (stream.B_c, stream.nwarps, stream.stages + 1) == \
        (table.B_c, table.nwarps, table.stages)
    names = {c: _plan.decode_kernel_names("bfloat16", c, False)["main"] for c in (table, stream)}

    def tile_of(batch, cap, num_splits=0, config=None, page=None):
        launches.clear()  # (np.zeros: pages of the caches never touched)
        q = FakeArray(np.zeros((batch, 1, 32, 128), BF16))
        shape, table = (batch, cap, 8, 128), None
        if page:
            shape, table = (batch * cap // page, page, 8, 128), \
                np.arange(batch * cap // page, dtype=np.int32).reshape(batch, -1)
        kc, vc = (FakeArray(np.zeros(shape, BF16)) for _ in range(2))
        _kvcache._forward_kvcache(q, kc, vc, [cap] * batch, None, None, table, False, None,
                                  (-1, -1), 0.0, None, num_splits, False, config)
        main, grid, block, smem, p = next(x for x in launches if "fa2_decode<" in x[0])
        cfg = next(c for c, n in names.items() if n == main)
        assert (block, smem, p["num_splits"]) == (cfg.threads, cfg.smem_bytes, grid[0])
        return cfg, grid[0]
    assert tile_of(14, 8192) == (stream, 1)  # (14 x 8 = 112 blocks >= 0.8 x 132)
    assert tile_of(16, 8192, num_splits=1) == (stream, 1)
    assert tile_of(13, 8192)[0] == table  # (104 blocks)
    assert tile_of(16, 8191)[0] == table
    assert tile_of(16, 8192, num_splits=2) == (table, 2)
    assert tile_of(16, 8192, config=table) == (table, 1)
    assert tile_of(16, 8192, page=256) == (table, 1)
    assert _plan.decode_stream_config(table, 112, 1, 8192, 132) is stream
    assert _plan.decode_stream_config(table, 112, 1, 8192, 132, paged=True) is table
    assert all(_plan.decode_stream_config(c, 10**4, 1, 10**6, 132) is c
               for c in _plan.TILES[("any", "decode", 64, False)])  # (not measured: the table's)


def test_each_kernel_after_the_first_is_launched_as_a_dependent(launches):
    """The decode's launches: the append, if any, as usual; the split attention as the
    append's programmatic dependent (else as usual); the combine as the split attention's
    (kernels/common.cuh grid_dependency_wait: each waits for the one before's writes)."""
    q, kc, vc, k, v = _arrays(2, 1, 32, 8, 128, 4096, new=1)
    for kw, roles, dependent in (
            ({}, ("fa2_decode<", "fa2_decode_combine<"), [False, True]),
            ({"k": k, "v": v}, ("append", "fa2_decode<", "combine"), [False, True, True]),
            ({"k": k, "v": v, "num_splits": 1}, ("append", "fa2_decode<"), [False, True]),
            ({"num_splits": 1}, ("fa2_decode<",), [False])):
        launches.clear()
        _kvcache.forward_kvcache(q, kc, vc, [4000, 3000], **kw)
        assert [next(r for r in roles if r in name) for name, *_ in launches] == list(roles)
        assert launches.dependent == dependent, kw


def _cuda_h_layout():
    """CUlaunchConfig's and CUlaunchAttribute's sizes and offsets, and the attribute's id, as
    a C compiler reads this machine's cuda.h; None where there is no cuda.h or compiler."""
    import glob
    import os
    import shutil
    import subprocess
    import tempfile
    headers = [h for h in [os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"),
                                        "include", "cuda.h")]
               + sorted(glob.glob("/usr/local/cuda*/include/cuda.h")) if os.path.exists(h)]
    cc = shutil.which("cc") or shutil.which("gcc")
    if not headers or not cc:
        return None
    program = r"""#include <cuda.h>
#include <stdio.h>
#include <stddef.h>
#define O(t, f) (int)offsetof(t, f)
int main(void) {
    printf("%d %d %d %d %d %d %d %d %d %d %d %d\n", (int)sizeof(CUlaunchConfig),
           O(CUlaunchConfig, gridDimX), O(CUlaunchConfig, blockDimX),
           O(CUlaunchConfig, sharedMemBytes), O(CUlaunchConfig, hStream),
           O(CUlaunchConfig, attrs), O(CUlaunchConfig, numAttrs),
           (int)sizeof(CUlaunchAttribute), O(CUlaunchAttribute, id),
           O(CUlaunchAttribute, value),
           O(CUlaunchAttributeValue, programmaticStreamSerializationAllowed),
           (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}"""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
        with open(src, "w") as f:
            f.write(program)
        if subprocess.run([cc, "-I", os.path.dirname(headers[0]), src, "-o", exe],
                          capture_output=True).returncode:
            return None
        return tuple(int(x) for x in subprocess.run([exe], capture_output=True,
                                                    text=True).stdout.split())


def test_dependent_launch_structs_match_cuda_h():
    """cuLaunchKernelEx's CUlaunchConfig and CUlaunchAttribute as ctypes lays them out: the
    sizes and offsets of cuda.h (CUDA 12 and 13, 64-bit), read from this machine's cuda.h
    where it has one and a C compiler, else as written there."""
    import ctypes

    from cuflash import _loader
    C, A = _loader._LaunchConfig, _loader._LaunchAttribute
    ours = (ctypes.sizeof(C), C.grid.offset, C.block.offset, C.shared_mem.offset,
            C.stream.offset, C.attrs.offset, C.num_attrs.offset, ctypes.sizeof(A),
            A.id.offset, A.value.offset, 0, _loader._PROGRAMMATIC_STREAM_SERIALIZATION)
    assert ours == (_cuda_h_layout() or (56, 0, 12, 24, 32, 40, 48, 72, 0, 8, 0, 6))


def test_dependent_launch_fills_the_launch_config(monkeypatch):
    """Launcher's dependent branch: cuLaunchKernelEx gets the grid, the block, the shared
    memory, the stream (0: the legacy default stream, NULL), the one attribute (programmatic
    stream serialization, on) and the parameter array; without the driver function, below
    sm_90 or with DEPENDENT_LAUNCHES off, it is an ordinary cuLaunchKernel."""

    from cuflash import _loader
    calls = []

    def launch_ex(config, func, params, extra):
        c = _loader._LaunchConfig.from_address(config)
        attr = _loader._LaunchAttribute.from_address(c.attrs)
        calls.append(("ex", tuple(c.grid), tuple(c.block), c.shared_mem, c.stream, c.num_attrs,
                      attr.id, attr.value[0], func, params, extra))
        return 0
    launcher = object.__new__(_loader.Launcher)  # (its __init__ needs a GPU)
    launcher.bind_thread = lambda: None
    launcher._func = 0x1234
    launcher._launch = lambda *a: calls.append(("plain",) + a)
    launcher._set_up_dependent(launch_ex)
    params = type("P", (), {"params": 0x5678})()
    launcher((3, 2, 1), 256, 1000, 0, params, dependent=True)
    launcher((4, 1, 2), 128, 0, 0xABC, params, dependent=True)
    assert calls == [("ex", (3, 2, 1), (256, 1, 1), 1000, None, 1, 6, 1, 0x1234, 0x5678, None),
                     ("ex", (4, 1, 2), (128, 1, 1), 0, 0xABC, 1, 6, 1, 0x1234, 0x5678, None)]
    launcher([3, 2, 1], 256, 1000, 0, params, dependent=True)  # (built once per launch)
    assert calls[-1] == calls[0] and len(launcher._ex_configs) == 2
    calls.clear()
    launcher((3, 2, 1), 256, 1000, 7, params)
    monkeypatch.setattr(_loader, "DEPENDENT_LAUNCHES", False)
    launcher((3, 2, 1), 256, 1000, 7, params, dependent=True)
    monkeypatch.setattr(_loader, "DEPENDENT_LAUNCHES", True)
    launcher._launch_ex = None  # (below sm_90, or a driver without cuLaunchKernelEx)
    launcher((3, 2, 1), 256, 1000, 7, params, dependent=True)
    assert calls == [("plain", 0x1234, 3, 2, 1, 256, 1, 1, 1000, 7, 0x5678, 0)] * 3
    launcher._launch_ex = lambda *a: 700  # (CUDA_ERROR_LAUNCH_FAILED)
    with pytest.raises(RuntimeError, match="CUresult 700"):
        launcher((3, 2, 1), 256, 1000, 7, params, dependent=True)


def test_paged_split_choice_aims_at_every_slot_for_long_blocks(launches):
    """num_splits=0 on a paged cache takes the paged rule: all the slots where its blocks on
    half of them would each hold over 2048 keys (48k keys here), half where they would not
    (8k keys: as a contiguous cache)."""
    cfg = _plan.decode_config(32, 227 * 1024)
    slots = 132 * cfg.blocks_per_sm(227 * 1024)
    q, kc, vc = _arrays(1, 1, 32, 8, 32, None, pages=3072, page=16)
    for n, more in ((48000, True), (8000, False)):
        launches.clear()
        _kvcache.forward_kvcache(q, kc, vc, [n], block_table=[list(range(3072))])
        splits = reference.num_splits_for(1, 8, 1, n, slots, cfg.B_c, cfg.nwarps, paged=True)
        assert launches[0][1] == (splits, 8, 1)
        contiguous = reference.num_splits_for(1, 8, 1, n, slots, cfg.B_c, cfg.nwarps)
        assert (splits > contiguous) == more, (n, splits, contiguous)


def test_tile_too_large_for_the_gpu_is_refused(launches):
    """An explicit tile whose shared memory exceeds the GPU's per-block limit is refused with
    the reason, before any launch (the driver's own answer is a bare invalid argument)."""
    q, kc, vc = _arrays(1, 1, 32, 8, 128, 1024)
    huge = _plan.DecodeConfig(128, 32, 8, 2)  # 2 x 8 x 2 x 2 x 32 x 128 bytes of K/V rings
    assert huge.smem_bytes > 227 * 1024
    with pytest.raises(ValueError, match="shared memory"):
        _kvcache._forward_kvcache(q, kc, vc, [1000], None, None, None, False, None, (-1, -1),
                                  0.0, None, 0, False, huge)
    assert not launches


def test_paged_append_one_split(launches):
    """Paged cache with new keys: the append first (a block per new key, KV head and entry),
    then the attention; one split writes O and L directly (no combine)."""
    q, kc, vc, k, v = _arrays(2, 3, 8, 2, 64, None, pages=10, page=16, new=3)
    table = [[3, 1, 7, 0], [2, 9, 5, 4]]
    _kvcache.forward_kvcache(q, kc, vc, [17, 40], k=k, v=v, block_table=table, causal=True,
                             num_splits=1)
    (app, agrid, _, _, pa), (main, grid, _, _, p) = launches
    assert app.startswith("cuflash::fa2_decode_append<cuflash::bf16>")
    assert agrid == (3, 2, 2) and grid == (1, 2 * 1, 2)
    assert (p["page_size"], p["block_table_stride"], p["seqlen_new"]) == (16, 4, 3)
    assert p["block_table"] and p["k_new"] == k.data.ptr and p["v_new"] == v.data.ptr
    assert p["o_partial"] == 0 and "Mask<true>" in main
    assert (p["kn_stride_b"], p["kn_stride_s"], p["kn_stride_h"]) == (3 * 2 * 64, 2 * 64, 64)


def test_alibi_packs_one_head_per_tile(launches):
    q, kc, vc = _arrays(2, 1, 8, 2, 128, 256)
    slopes = FakeArray(np.full(8, 0.1, np.float32))
    _kvcache.forward_kvcache(q, kc, vc, 100, alibi_slopes=slopes, num_splits=2)
    (main, grid, _, _, p), _ = launches
    assert "ScoreHook" in main and p["pack"] == 1 and grid == (2, 8, 2)
    assert p["alibi_slopes"] == slopes.data.ptr


@pytest.mark.parametrize("kw, err, msg", [
    ({"cache_seqlens": [30, 40]}, ValueError, "capacity"),
    ({"cache_seqlens": [3, 20], "block_table": [[0, 1], [2, 9]]}, ValueError, "pages outside"),
    ({"heads": 3}, ValueError, "multiple of the cache"),
    ({"d": 60}, ValueError, "multiples of 8"),
    ({"num_splits": -1}, ValueError, "num_splits"),
    ({"k_only": True}, ValueError, "both k and v"),
    ({"cache_dtype": np.float16}, TypeError, "same dtype"),
])
def test_inputs_are_checked(launches, kw, err, msg):
    h, d = kw.get("heads", 8), kw.get("d", 64)
    rng = np.random.default_rng(0)
    q = FakeArray(rng.standard_normal((2, 1, h, d)).astype(BF16))
    kc = FakeArray(rng.standard_normal((2, 32, 2, d)).astype(kw.get("cache_dtype", BF16)))
    vc = FakeArray(np.zeros((2, 32, 2, d), kw.get("cache_dtype", BF16)))
    extra = {"k": FakeArray(np.zeros((2, 1, 2, d), BF16))} if kw.get("k_only") else {}
    with pytest.raises(err, match=msg):
        _kvcache.forward_kvcache(q, kc, vc, kw.get("cache_seqlens", [1, 1]),
                                 block_table=kw.get("block_table"),
                                 num_splits=kw.get("num_splits", 0), **extra)
    assert not launches


def test_host_table_with_device_lengths_is_checked_whole(launches):
    """With cache_seqlens on the GPU (trusted) a host block table's every entry must name a
    page of the cache: a wrong page would be read and written out of bounds."""
    q, kc, vc = _arrays(2, 1, 8, 2, 64, None, pages=4, page=16)
    lens = FakeArray(np.array([3, 20], np.int32))
    with pytest.raises(ValueError, match="pages outside"):
        _kvcache.forward_kvcache(q, kc, vc, lens, block_table=[[0, 1], [2, 4]])
    _kvcache.forward_kvcache(q, kc, vc, lens, block_table=[[0, 1], [2, 3]], num_splits=1)
    assert len(launches) == 1


def test_append_refuses_caches_whose_rows_share_memory(launches):
    q, kc, vc, k, v = _arrays(2, 1, 8, 2, 64, 32, new=1)
    shared = FakeArray(np.broadcast_to(kc.a[:1], kc.shape))  # (batch stride 0)
    with pytest.raises(ValueError, match="share memory"):
        _kvcache.forward_kvcache(q, shared, vc, [1, 1], k=k, v=v)
    with pytest.raises(ValueError, match="shares memory"):
        _kvcache.forward_kvcache(q, kc, kc, [1, 1], k=k, v=v)
    assert not launches


def test_no_query_heads_still_appends(launches):
    q, kc, vc, k, v = _arrays(2, 1, 0, 2, 64, 32, new=1)
    out, lse = _kvcache.forward_kvcache(q, kc, vc, [1, 1], k=k, v=v)
    assert out.shape == (2, 1, 0, 64) and [name for name, *_ in launches] == \
        ["cuflash::fa2_decode_append<cuflash::bf16>"]


def test_self_overlap_test():
    assert not _kvcache._self_overlapping((2, 32, 2, 64), (8192, 256, 128, 2), 2)
    assert _kvcache._self_overlapping((2, 32, 2, 64), (0, 256, 128, 2), 2)
    assert _kvcache._self_overlapping((2, 32, 2, 64), (8192, 64, 128, 2), 2)
    assert not _kvcache._self_overlapping((1, 32, 2, 64), (0, 256, 128, 2), 2)


def test_given_out_and_lse_are_written(launches):
    """out= and lse= (cuflash.jax's XLA buffers): the launch writes the given arrays, checked
    as forward's are; one that shares memory with the cache is refused."""
    q, kc, vc, k, v = _arrays(2, 1, 8, 2, 64, 256, new=1)
    out = FakeArray(np.zeros(q.shape, BF16))
    lse = FakeArray(np.zeros((2, 8, 1), np.float32))
    got = _kvcache.forward_kvcache(q, kc, vc, [3, 7], k=k, v=v, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    for name, _, _, _, p in launches:  # (append, attention, combine: one struct)
        assert (p["o"], p["lse"]) == (out.data.ptr, lse.data.ptr), name
    with pytest.raises(ValueError, match="out must have shape"):
        _kvcache.forward_kvcache(q, kc, vc, [3, 7], out=FakeArray(np.zeros((2, 2, 8, 64), BF16)))
    with pytest.raises(ValueError, match="share memory|overlap"):
        _kvcache.forward_kvcache(q, kc, vc, [3, 7], k=k, v=v,
                                 out=FakeArray(np.zeros(q.shape, BF16), ptr=kc.data.ptr))


def _decode_inputs(paged, append):
    """Fresh arrays of one decode signature: 2 entries, 32/8 heads, d 128, lengths 100 and
    300 on the GPU; paged: 64 pages of 16 keys (a device table); append: that many new keys."""
    if paged:
        q, kc, vc, *new = _arrays(2, 1, 32, 8, 128, None, pages=64, page=16, new=append)
        table = FakeArray(np.arange(64, dtype=np.int32).reshape(2, 32))
    else:
        q, kc, vc, *new = _arrays(2, 1, 32, 8, 128, 512, new=append)
        table = None
    lens = FakeArray(np.array([100, 300], np.int32))
    return q, kc, vc, lens, table, dict(k=new[0], v=new[1]) if append else {}


_FRESH = ("o", "lse", "o_partial", "lse_partial")  # (each call's own allocations)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("append", [0, 3])
@pytest.mark.parametrize("options", [{}, {"causal": True, "window_size": (50, 0),
                                          "softcap": 5.0, "num_splits": 1}])
def test_repeated_kvcache_call_packs_what_the_full_path_packs(launches, monkeypatch, paged,
                                                              append, options):
    """A call with the signature of an earlier one (lengths and table on the GPU) launches
    the remembered kernels with the struct the full path packs for its own arrays, without
    the full path's checks; its outputs are the addresses it packs."""
    checked = []
    check = _kvcache._check_lengths_and_table
    monkeypatch.setattr(_kvcache, "_check_lengths_and_table",
                        lambda *a, **kw: checked.append(1) or check(*a, **kw))

    def call(inputs):
        q, kc, vc, lens, table, kv = inputs
        before = len(launches)
        out, lse = _kvcache.forward_kvcache(q, kc, vc, lens, block_table=table, **kv,
                                            **options)
        return [x + (d,) for x, d in zip(launches[before:], launches.dependent[before:])], \
            out, lse

    call(_decode_inputs(paged, append))  # the full path, remembered
    assert len(_kvcache._repeats) == 1 and len(checked) == 1
    inputs = _decode_inputs(paged, append)
    repeat, out, lse = call(inputs)  # a repeat on new arrays
    assert len(checked) == 1  # (not the full path)
    assert len(repeat) == (2 if append else 1) + (options.get("num_splits", 0) != 1)
    p = repeat[-1][4]
    assert [d for *_, d in repeat] == [False] + [True] * (len(repeat) - 1)
    assert (p["o"], p["lse"]) == (out.data.ptr, lse.data.ptr)
    assert p["q"] == inputs[0].data.ptr and p["cache_seqlens"] == inputs[3].data.ptr
    monkeypatch.setattr(_kvcache, "_repeats", {})
    full, _, _ = call(inputs)  # the same arrays on the full path
    assert len(checked) == 2
    for (r_name, r_grid, r_block, r_smem, r_p, r_dep), \
            (f_name, f_grid, f_block, f_smem, f_p, f_dep) in zip(repeat, full, strict=True):
        assert (r_name, r_grid, r_block, r_smem, r_dep) == \
            (f_name, f_grid, f_block, f_smem, f_dep)
        assert {k: v for k, v in r_p.items() if k not in _FRESH} == \
            {k: v for k, v in f_p.items() if k not in _FRESH}
        assert all(bool(r_p[k]) == bool(f_p[k]) for k in _FRESH)


def test_repeated_kvcache_call_keeps_every_check(launches):
    """What may differ between calls of one signature is still checked on a repeat (the full
    path runs and raises its errors): an array that is not CuPy's, one on another GPU, a
    cache off its 16-byte grid, an append whose cache shares memory with k; a misaligned q
    is copied as on the full path. Lengths from the host are checked on every call."""
    q, kc, vc, lens, _, kv = _decode_inputs(False, 3)
    _kvcache.forward_kvcache(q, kc, vc, lens, **kv)
    _kvcache.forward_kvcache(q, kc, vc, lens, **kv)
    assert len(_kvcache._repeats) == 1
    with pytest.raises(TypeError, match="numpy.ndarray"):
        _kvcache.forward_kvcache(q, kc.a, vc, lens, **kv)
    k1 = FakeArray(kc.a.copy())
    k1.data.device_id = 1
    with pytest.raises(ValueError, match="same GPU"):
        _kvcache.forward_kvcache(q, k1, vc, lens, **kv)
    with pytest.raises(ValueError, match="16-byte boundary"):
        _kvcache.forward_kvcache(q, FakeArray(kc.a.copy(), (1 << 40) + 8), vc, lens, **kv)
    with pytest.raises(ValueError, match="shares memory"):
        _kvcache.forward_kvcache(q, kc, vc, lens, k=FakeArray(kv["k"].a.copy(), kc.data.ptr),
                                 v=kv["v"])
    class Elementwise(FakeArray):  # (== as CuPy's: an array, whose truth value raises)
        def __eq__(self, other):
            return self.a == getattr(other, "a", other)
        __hash__ = FakeArray.__hash__

    odd = Elementwise(q.a.copy(), (1 << 41) + 2)
    _kvcache.forward_kvcache(odd, kc, vc, lens, **kv)
    assert launches[-1][4]["q"] % 16 == 0 and launches[-1][4]["q"] != odd.data.ptr
    k_odd = Elementwise(kv["k"].a.copy(), (1 << 42) + 2)
    _kvcache.forward_kvcache(q, kc, vc, lens, k=k_odd, v=kv["v"])
    assert launches[-2][4]["k_new"] % 16 == 0 and launches[-2][4]["k_new"] != k_odd.data.ptr
    with pytest.raises(ValueError):  # (host lengths past the cache: the full path's check)
        _kvcache.forward_kvcache(q, kc, vc, [100, 600], **kv)
