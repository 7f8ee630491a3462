"""CPU: bad input gets a clear error. Shape/dtype/stride rules are checked on NumPy arrays
(the checks read metadata only); the public entry point's type check needs CuPy importable
but no GPU."""

import itertools

import ml_dtypes
import numpy as np
import pytest

from cuflash import _api, _plan, _registry

BF16 = ml_dtypes.bfloat16


def qkv(b=2, sq=16, sk=16, h=4, hk=4, d=64, dtype=np.float16):
    return (np.zeros((b, sq, h, d), dtype), np.zeros((b, sk, hk, d), dtype),
            np.zeros((b, sk, hk, d), dtype))


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_valid_shapes_pass(dtype):
    _api._check_shapes(*qkv(dtype=dtype))
    _api._check_shapes(*qkv(h=8, hk=2, sq=3, sk=1025, d=8, dtype=dtype))       # GQA
    _api._check_shapes(*qkv(h=8, hk=1, d=256, dtype=dtype))                    # MQA, d=256
    q = np.zeros((2, 4, 16, 64), np.float16).transpose(0, 2, 1, 3)            # strided
    _api._check_shapes(q, q, q)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_unsupported_dtype(dtype):
    with pytest.raises(TypeError, match="float16 and bfloat16"):
        _api._check_shapes(*qkv(dtype=dtype))


def test_dtype_mismatch():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="same dtype"):
        _api._check_shapes(q, k.astype(BF16), v)


@pytest.mark.parametrize("d", [0, 257, 264, 512])
def test_unsupported_head_dim(d):
    with pytest.raises(ValueError, match=f"head dim {d} is not supported"):
        _api._check_shapes(*qkv(d=d))


@pytest.mark.parametrize("d", [1, 3, 4, 12, 59, 100, 111, 255, 256])
def test_any_head_dim_from_1_to_256(d):
    """FlashAttention-2 takes any head dim up to 256: those that are not a multiple of 8 go to
    the OddD kernels (element-wise loads, the window and the hook always on), in the bucket
    above them."""
    _api._check_shapes(*qkv(d=d))
    HD = _plan.head_dim_bucket(d)
    assert d <= HD and HD - d < 32
    for causal in (False, True):
        cfg = _plan.forward_config(HD, causal, 227 * 1024, 4096, odd_d=d % 8 != 0)
        assert cfg.odd_d == (d % 8 != 0) and cfg.tile_type.startswith("cuflash::OddD<") == \
            cfg.odd_d
        name = _plan.forward_kernel_name("bfloat16", cfg, causal, True, True)
        assert name in {n for _, n in _plan.all_specialisations("80")}
    bcfg = _plan.backward_config(HD, 227 * 1024, True, odd_d=True)
    assert bcfg.odd_d and _plan.backward_kernel_name("bfloat16", bcfg, True, local=True,
                                                     hooked=True) in \
        {n for _, n in _plan.all_specialisations("90")}


def test_odd_head_dim_turns_on_the_window_and_the_hook():
    """The OddD kernels have the window and the hook always: a call without them gets sides
    past every key (causal: right = 0) and the hook's defaults."""
    assert _api._odd_d_features(False, False, 0, 0, 100, 300) == (True, 400, 400, True)
    assert _api._odd_d_features(True, False, 0, 0, 100, 300) == (True, 400, 0, True)
    assert _api._odd_d_features(True, True, 16, 0, 100, 300) == (True, 16, 0, True)


def test_shape_mismatches():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="4-D"):
        _api._check_shapes(q[0], k, v)
    with pytest.raises(ValueError, match="same shape"):
        _api._check_shapes(q, k, v[:, :8])
    with pytest.raises(ValueError, match="batch and headdim"):
        _api._check_shapes(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        _api._check_shapes(*qkv(h=4, hk=3))


def test_last_dim_must_be_contiguous():
    q, k, v = qkv()
    q2 = np.zeros((2, 16, 4, 128), np.float16)[..., ::2]
    with pytest.raises(ValueError, match="contiguous in its last"):
        _api._check_shapes(q2, k, v)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_softmax_scale(scale):
    with pytest.raises(ValueError, match="softmax_scale"):
        _api._softmax_scale(scale, 64)


def test_default_softmax_scale():
    assert _api._softmax_scale(None, 64) == 0.125


def test_head_dim_buckets():
    assert [_plan.head_dim_bucket(d) for d in (8, 32, 40, 128, 136, 256)] == \
        [32, 32, 64, 128, 160, 256]
    with pytest.raises(ValueError):
        _plan.head_dim_bucket(264)


def test_numpy_arrays_get_a_hint():
    pytest.importorskip("cupy", reason="CuPy not installed: the public API cannot be called")
    import cuflash
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"numpy.ndarray.*cupy.asarray"):
        cuflash.forward(q, k, v)
    with pytest.raises(TypeError, match="must be a cupy.ndarray"):
        cuflash.forward([1, 2], k, v)


def test_empty_arrays_pass_layout_checks():
    # CuPy reports all-zero strides for empty arrays: they must not trip the stride check.
    q = np.lib.stride_tricks.as_strided(np.zeros(1, np.float16), (0, 16, 2, 64), (0, 0, 0, 0))
    _api._check_shapes(q, q, q)


def test_backward_rejects_numpy_and_bad_lse():
    pytest.importorskip("cupy", reason="CuPy not installed: the public API cannot be called")
    import cuflash
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"numpy.ndarray.*cupy.asarray"):
        cuflash.backward(q, q, k, v, q, np.zeros((2, 4, 16), np.float32))


def test_backward_buckets():
    assert [_plan.backward_head_dim_bucket(d) for d in (8, 64, 72, 96, 128, 136, 232, 256)] == \
        [32, 64, 96, 96, 128, 160, 256, 256]
    for HD in _plan.BACKWARD_HEAD_DIM_BUCKETS:
        assert _plan.backward_config(HD, 163 * 1024).smem_bytes <= 163 * 1024   # A100
    for HD in (32, 64, 96, 128):
        for bulk in (False, True):  # sm_86/89, and sm_120 (bulk copies, 99 KB)
            assert _plan.backward_config(HD, 99 * 1024, bulk).smem_bytes <= 99 * 1024
    with pytest.raises(RuntimeError, match="shared memory"):
        _plan.backward_config(256, 99 * 1024)


def test_backward_grid_by_mode():
    """One block per column block (T_c, heads, batch); split slices (splits, heads, batch);
    ordered dQ additions without the mask (heads, batch, T_c), whose T_c is a grid z limit that
    gets a clear error instead of a failed launch."""
    assert _registry.backward_grid(40, 16, 2, False, False) == (40, 16, 2)
    assert _registry.backward_grid(40, 16, 2, True, False, splits=5) == (5, 16, 2)
    assert _registry.backward_grid(40, 16, 2, True, True) == (40, 16, 2)
    assert _registry.backward_grid(40, 16, 2, False, True) == (16, 2, 40)
    assert _registry.backward_grid(70000, 1, 1, True, True) == (70000, 1, 1)
    with pytest.raises(ValueError, match="at most 65535 key blocks"):
        _registry.backward_grid(70000, 1, 1, False, True)



def test_ordered_wave_heads():
    """The Hopper backward's ordered non-causal grid: H (batch, kv head) pairs at once, the
    divisor of the pairs nearest to SMs / 16 by ratio (session 15's sweep: H 4-16 best)."""
    from cuflash import _plan
    assert _registry.ordered_wave_heads(128, 132) == 8      # 132 / 16 = 8.25
    assert _registry.ordered_wave_heads(32, 132) == 8
    assert _registry.ordered_wave_heads(12, 132) == 6       # 6 and 12: 1.375 against 1.45
    assert _registry.ordered_wave_heads(127, 132) == 1      # prime: 1 (8.25) before 127
    assert _registry.ordered_wave_heads(4, 132) == 4        # fewer pairs than the target
    assert _registry.ordered_wave_heads(1, 132) == 1
    assert _registry.ordered_wave_heads(100, 16) == 1       # a small GPU: one at a time
    assert _registry.ordered_wave_heads(65537, 132) == 65537  # prime: 1 would give z > 65535
    cfg = _plan.sm90_backward_config(128, ordered=True)
    T_c = -(-2048 // cfg.B_c)
    assert _registry.sm90_backward_grid(cfg, 2048, 16, 8, False, True, 132) == \
        (8, T_c, 16)
    assert _registry.sm90_backward_grid(cfg, 2048, 16, 8, True, True, 132) == \
        (T_c, 16, 8)
    assert _registry.sm90_backward_grid(cfg, 2048, 16, 8, False, False, 132) == \
        (T_c, 16, 8)
    # the causal mask alone, not ordered: (kv heads, column blocks, batch), the longest first
    assert _registry.sm90_backward_grid(cfg, 2048, 16, 8, True, False, 132) == (16, T_c, 8)
    assert _registry.sm90_backward_grid(cfg, 2048, 16, 8, True, False, 132, local=True) == \
        (T_c, 16, 8)
    assert _registry.sm90_backward_grid(cfg, 2048, 16, 8, True, False, 132, packed=True) == \
        (T_c, 16, 8)
    with pytest.raises(ValueError, match="holds at most 65535 key blocks"):
        _registry.sm90_backward_grid(cfg, 65536 * cfg.B_c, 1, 1, True, False, 132)


def test_backward_tile_pitch():
    """Head dims that are not whole 64-element swizzle groups get a 64-multiple row pitch in
    shared memory when the layout splits them across warps, and count it in smem_bytes."""
    split96 = _plan.BackwardConfig(96, 64, 128, 8, 4, 4, 4, 1)
    assert split96.pitch == 128
    kv, rows, p = 2 * 128 * 128 * 2, 2 * 64 * 128 * 2 + 2 * 64 * 4, 2 * 64 * 128 * 2
    assert split96.smem_bytes == kv + rows + p
    assert _plan.BackwardConfig(224, 64, 64, 8, 4, 4, 4, 2).pitch == 256
    assert _plan.BackwardConfig(160, 64, 64, 8, 4, 4, 4, 2).pitch == 192
    assert _plan.BackwardConfig(32, 128, 128, 8, 4, 8, 8, 2).pitch == 32    # not split
    assert _plan.BackwardConfig(128, 64, 128, 8, 2, 4, 2, 2).pitch == 128


def test_forward_shapes_by_key_length_and_gpu_class():
    """d 64 takes two K/V stages for short key sequences (non-causal <= 1024, causal <= 4096);
    d 128 non-causal takes 32 rows per warp on the 227 KB (sm_90) class only; every shape the
    planner can pick is in the compile check's list for its class."""
    for n, causal, stages in [(1024, False, 2), (1025, False, 1), (4096, True, 2), (4097, True, 1),
                              (None, False, 1), (None, True, 1)]:
        assert _plan.forward_config(64, causal, seqlen_k=n).kv_stages == stages
    assert not _plan.forward_short(128, False, 16)
    sm90 = _plan.forward_config(128, False, 227 * 1024)
    assert (sm90.B_r, sm90.B_c, sm90.nwarps, sm90.kv_stages) == (128, 64, 4, 2)
    for smem in (99 * 1024, 163 * 1024):
        assert _plan.forward_config(128, False, smem).B_r == 64
    assert _plan.forward_config(128, True, 227 * 1024).B_r == 64
    for arch, smems in _plan.ARCH_SMEM.items():
        names = {n for _, n in _plan.all_specialisations(arch)}
        for smem in smems:
            for HD in _plan.HEAD_DIM_BUCKETS:
                for causal in (False, True):
                    if arch == "90a":  # the Hopper family: its tiles per padded head dim
                        for n in (1, 512, 4096, None):
                            cfg = _plan.sm90_forward_config(HD, causal, n)
                            assert _plan.sm90_forward_kernel_name("bfloat16", cfg,
                                                                  causal) in names
                        continue
                    for n in (1, 512, 4096, None):
                        cfg = _plan.forward_config(HD, causal, smem, n)
                        assert _plan.forward_kernel_name("bfloat16", cfg, causal) in names


def test_each_architecture_class_builds_the_shapes_planned_for_it():
    """The compile check builds, per architecture class, exactly the shapes the planner picks
    for that class's shared memory, and every one of them fits it."""
    union = {n for _, n in _plan.all_specialisations()}
    for arch, smems in _plan.ARCH_SMEM.items():
        names = {n for _, n in _plan.all_specialisations(arch)}
        assert names <= union
        if arch == "90a":  # the Hopper families alone: the forward's tiles per padded head
            # dim (sliding windows: local; the score hook: hooked; variable-length batches:
            # packed; on their own tiles where listed), the backward's three kernels per
            # bucket up to 128, mask and order, windows and the deterministic mode included
            # (with the score hook, the hooked buckets; packed batches: not ordered)
            tiles = {(cfg, c, local, hooked, packed) for HD in _plan.HEAD_DIM_BUCKETS
                     for c, local, hooked, packed in itertools.product((False, True), repeat=4)
                     for cfg in _plan.sm90_forward_configs(HD, c, local, hooked, packed)}
            backward = {(_plan.sm90_backward_config(HD, local, ordered, hooked, packed), c,
                         local, ordered, hooked, packed)
                        for HD in _plan.SM90_BACKWARD_BUCKETS
                        for c, local, ordered, hooked, packed in itertools.product(
                            (False, True), repeat=5)
                        if HD in _plan.sm90_backward_buckets(hooked, packed)
                        and not (packed and ordered)}
            assert names == {_plan.sm90_forward_kernel_name(dt, cfg, c, local, hooked, packed)
                             for dt in _plan.ELEMENT_TAGS
                             for cfg, c, local, hooked, packed in tiles} | \
                {name for dt in _plan.ELEMENT_TAGS
                 for cfg, c, local, ordered, hooked, packed in backward
                 for name in _plan.sm90_backward_names(dt, cfg, c, local, ordered, hooked,
                                                       packed).values()}
            assert all(cfg.smem_bytes <= smems[0] for cfg, *_ in tiles | backward)
            continue
        bulk = _plan.has_bulk_copy(int(arch))  # the dQ bulk reduction: sm_90 only
        for smem in smems:
            for dt in _plan.ELEMENT_TAGS:
                for HD in _plan.BACKWARD_HEAD_DIM_BUCKETS:
                    if HD > 128 and smem < 144 * 1024:
                        continue  # no backward above d 128 on 99 KB GPUs (a clear error)
                    cfg = _plan.backward_config(HD, smem, bulk)
                    assert cfg.smem_bytes <= smem
                    # bulk dQ wherever the GPU has it (every head dim has a spill-free one)
                    assert bool(cfg.dq_bulk) == bulk
                    for causal, local, hooked in itertools.product((False, True), repeat=3):
                        # (local: sliding windows; hooked: softcap, ALiBi)
                        cfg = _plan.backward_config(HD, smem, bulk, local, hooked)
                        assert cfg.smem_bytes <= smem and bool(cfg.dq_bulk) == bulk
                        assert _plan.backward_kernel_name(dt, cfg, causal, local=local,
                                                          hooked=hooked) in names
                        if bulk:  # the deterministic mode's ordered-additions kernel
                            assert _plan.backward_kernel_name(dt, cfg, causal, True, local,
                                                              hooked) in names
                        assert _plan.backward_dq_name(dt, cfg, causal, local) in names
                for HD in _plan.HEAD_DIM_BUCKETS:
                    for local, hooked in itertools.product((False, True), repeat=2):
                        cfg = _plan.forward_config(HD, False, smem, local=local, hooked=hooked)
                        assert cfg.smem_bytes <= smem
                        assert _plan.forward_kernel_name(dt, cfg, False, local, hooked) in names
    # A100 and H200 take different d = 256 backward shapes (163 KB vs 227 KB).
    assert _plan.backward_config(256, 163 * 1024) != _plan.backward_config(256, 227 * 1024)


def test_arrays_on_different_gpus_are_rejected():
    assert _api._common_device({"q": 1, "k": 1, "v": 1}) == 1
    with pytest.raises(ValueError, match=r"same GPU.*'k': 1"):
        _api._common_device({"q": 0, "k": 1, "v": 0})


@pytest.mark.parametrize("cc,name", [(75, "7.5"), (70, "7.0"), (61, "6.1")])
def test_gpus_older_than_sm80_are_named(cc, name):
    with pytest.raises(RuntimeError, match=f"device 0 has compute capability {name}"):
        _api._check_capability(0, cc)
    _api._check_capability(0, 80)
    _api._check_capability(0, 90)


def test_unknown_algorithm_is_rejected_before_anything_else():
    pytest.importorskip("cupy", reason="CuPy not installed: the public API cannot be called")
    import cuflash
    q, k, v = qkv()
    with pytest.raises(ValueError, match="algorithm must be 'fa2' or 'fa1'"):
        cuflash.forward(q, k, v, algorithm="fa3")


# ---- hardening (issue 15): arguments that used to be read wrongly or crash ------------------

def test_byte_strides_must_be_whole_elements():
    """An as_strided view whose byte strides are not multiples of the item size would be
    rounded down to whole elements by the kernels: refused."""
    base = np.zeros(4096, np.float16)
    bad = np.lib.stride_tricks.as_strided(base, (1, 4, 2, 64), (4096, 257, 128, 2))
    q, k, v = qkv(b=1, sq=4, sk=4, h=2, hk=2)
    with pytest.raises(ValueError, match="not multiples of its item size"):
        _api._check_shapes(bad, k, v)


@pytest.mark.parametrize("scale", [3e38, 1e-50, True, False, "0.1", 1j, np.bool_(True),
                                   float("-inf"), -0.0])
def test_softmax_scale_must_be_a_float32_real(scale):
    with pytest.raises(ValueError, match="softmax_scale") as err:
        _api._softmax_scale(scale, 64)
    assert repr(scale) in str(err.value)  # the message names the value


@pytest.mark.parametrize("scale", [0.1, np.float32(0.25), np.float64(2.0), 7, 1e30])
def test_softmax_scale_accepts_reals(scale):
    assert _api._softmax_scale(scale, 64) == float(scale)


@pytest.mark.parametrize("flag", ["False", "True", 0, 1, None, 1.0])
def test_flags_must_be_bools(flag):
    with pytest.raises(TypeError, match="must be a bool"):
        _api._check_flag("causal", flag)
    assert _api._check_flag("causal", np.bool_(True)) is True
    assert _api._check_flag("causal", False) is False


def test_public_flags_are_checked_before_anything_runs():
    import cuflash
    q, k, v = qkv()
    with pytest.raises(TypeError, match="causal must be a bool"):
        cuflash.forward(q, k, v, causal="False")
    with pytest.raises(TypeError, match="verbose must be a bool"):
        cuflash.forward(q, k, v, verbose="yes")
    with pytest.raises(TypeError, match="algorithm must be"):
        cuflash.forward(q, k, v, algorithm=2)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        cuflash.backward(q, q, k, v, q, None, deterministic="True")


def test_public_signatures_show_no_tuning_hooks():
    import inspect

    import cuflash
    for fn in (cuflash.forward, cuflash.backward, cuflash.attention_with_vjp,
               cuflash.precompile):
        params = inspect.signature(fn).parameters
        assert not [p for p in params if p.startswith("_")], fn.__name__
        assert "Raises" in fn.__doc__, f"{fn.__name__}: no Raises section"


class _Fake:
    """What _check_no_overlap reads of an array: .data.ptr, shape, strides, itemsize, size."""

    def __init__(self, ptr, shape, strides, itemsize=2):
        self.data = type("D", (), {"ptr": ptr})()
        self.shape, self.strides, self.itemsize = shape, strides, itemsize
        self.size = int(np.prod(shape))


def test_byte_ranges_and_overlap():
    a = _Fake(1000, (2, 3), (6, 2))                   # bytes 1000 .. 1012
    assert _api._byte_range(1000, a) == (1000, 1012)
    neg = _Fake(1000, (4,), (-2,))                    # 994 .. 1002
    assert _api._byte_range(1000, neg) == (994, 1002)
    assert _api._byte_range(1000, _Fake(1000, (0, 3), (6, 2))) == (1000, 1000)
    _api._check_no_overlap({"out": _Fake(1012, (2, 3), (6, 2))}, {"q": a})  # adjacent: fine
    with pytest.raises(ValueError, match="out shares memory with q"):
        _api._check_no_overlap({"out": _Fake(1010, (2, 3), (6, 2))}, {"q": a})
    with pytest.raises(ValueError, match="dq shares memory with dk"):
        _api._check_no_overlap({"dq": a, "dk": _Fake(1004, (1,), (2,))}, {})
    with pytest.raises(ValueError, match="lse shares memory with v"):
        _api._check_no_overlap({"lse": _Fake(990, (2,), (4,), 4)}, {"v": neg})


def test_deterministic_split_scratch_is_bounded():
    """sm_80-89 deterministic mode: the split slices of float32 dQ stay within
    max(2 x dQ, 64 MiB) (it was up to 16 copies: 1 GiB for a 32 MiB q)."""
    cfg = _plan.BackwardConfig(128, 64, 128, 8, 2, 4, 2, 2)
    slice_bytes = 4 * 32768 * 128 * 4                 # b x h = 4, seqlen 32k, d 128
    splits = _registry.deterministic_splits(108, 256, 4, cfg, 32768, slice_bytes, False)
    assert 1 <= splits <= 2
    small = 1 * 2 * 1024 * 128 * 4                     # 1 MiB: many slices are allowed
    assert _registry.deterministic_splits(108, 8, 2, cfg, 1024, small, False) > 2


def test_gqa_head_parts():
    """GQA backward: one part per kv head (no float32 dK/dV copies) unless that leaves SMs
    idle; then the smallest divisor of the group that fills them."""
    assert _registry.head_parts(4, 32 * 8 * 4, 132) == 1    # 32 kv blocks x 8 kv heads x batch 4
    assert _registry.head_parts(8, 1, 132) == 8
    assert _registry.head_parts(6, 30, 132) == 6
    assert _registry.head_parts(6, 50, 132) == 3
    assert _registry.head_parts(1, 1, 132) == 1


def test_no_gpu_messages(monkeypatch):
    """Without a GPU, precompile() says so plainly (not with a CUDA driver traceback)."""
    class NoGpuCupy:
        class cuda:
            @staticmethod
            def is_available():
                return False
    monkeypatch.setattr(_api, "_cupy", lambda: NoGpuCupy)
    import cuflash
    with pytest.raises(RuntimeError, match="no CUDA GPU found"):
        cuflash.precompile()
