"""CPU: the host path of forward, backward and FA1 with a stand-in for CuPy and the driver.

CI has no GPU, so the GPU tests cannot run there; these run the Python between the argument
checks and the driver call: planning, scratch allocation, packing each kernel's parameter
struct, grids and launches. Every launch must pack its struct in full (a field the host forgot
is a TypeError from the generated packer) with the planned tile, grid and shared memory, and
the pointers must be the arrays' own."""

import contextlib
import struct
import types

import ml_dtypes
import numpy as np
import pytest
from param_helpers import member_value

from cuflash import _api, _loader, _params, _plan, _registry, _tma

BF16 = ml_dtypes.bfloat16


class _Mem:
    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0


class FakeArray:
    """What cuflash reads of a cupy.ndarray, over a NumPy array, at a fake device address."""
    _next = [1 << 32]

    def __init__(self, a, ptr=None):
        self.a = a
        if ptr is None:
            ptr = FakeArray._next[0]
            FakeArray._next[0] += (a.nbytes + 511) // 256 * 256 + 256
        self.data = _Mem(ptr)

    shape = property(lambda self: self.a.shape)
    strides = property(lambda self: self.a.strides)
    dtype = property(lambda self: self.a.dtype)
    itemsize = property(lambda self: self.a.itemsize)
    size = property(lambda self: self.a.size)
    ndim = property(lambda self: self.a.ndim)
    flags = property(lambda self: self.a.flags)

    def copy(self):
        return FakeArray(self.a.copy())

    def fill(self, value):
        self.a.fill(value)

    def transpose(self, *axes):
        return FakeArray(self.a.transpose(*axes), self.data.ptr)

    def __getitem__(self, i):  # (only whole leading slices: the address moves with them)
        sub = self.a[i]
        return FakeArray(sub, self.data.ptr + (sub.__array_interface__["data"][0] -
                                               self.a.__array_interface__["data"][0]))

    def __setitem__(self, i, value):
        self.a[i] = value.a if isinstance(value, FakeArray) else value

    def sum(self, axis):
        return FakeArray(self.a.sum(axis=axis))

    def _op(self, other, f):
        return FakeArray(f(self.a, other.a if isinstance(other, FakeArray) else other))

    __add__ = lambda self, other: self._op(other, np.add)  # noqa: E731
    __sub__ = lambda self, other: self._op(other, np.subtract)  # noqa: E731
    __floordiv__ = lambda self, other: self._op(other, np.floor_divide)  # noqa: E731

    def view(self, dtype):
        return FakeArray(self.a.view(dtype), self.data.ptr)

    def reshape(self, shape):
        return FakeArray(self.a.reshape(shape), self.data.ptr)

    nbytes = property(lambda self: self.a.nbytes)


def _fake_cupy(sms=132, smem=227 * 1024, cc=90):
    cp = types.SimpleNamespace()
    cp.ndarray = FakeArray
    cp.float32, cp.int32 = np.float32, np.int32
    cp.empty = lambda shape, dtype=np.float32: FakeArray(np.zeros(shape, dtype))  # (defined)
    cp.zeros = lambda shape, dtype=np.float32: FakeArray(np.zeros(shape, dtype))
    cp.full = lambda shape, value, dtype=np.float32: FakeArray(np.full(shape, value, dtype))
    cp.asarray = lambda a: FakeArray(np.array(a))
    cp.asnumpy = lambda x: x.a.copy()
    cp.ascontiguousarray = lambda x: FakeArray(np.ascontiguousarray(x.a))
    cp.cumsum = lambda x: FakeArray(np.cumsum(x.a))

    def _sum(x, axis=None, out=None):
        out[...] = x.a.sum(axis=axis)
        return out
    cp.sum = _sum
    cp.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(
        as_strided=lambda x, shape, strides: FakeArray(
            np.lib.stride_tricks.as_strided(x.a, shape, strides), x.data.ptr)))
    props = {"multiProcessorCount": sms, "sharedMemPerBlockOptin": smem, "major": cc // 10,
             "minor": cc % 10, "l2CacheSize": 50 << 20}

    class Device:
        def __init__(self, i=0):
            self.id, self.compute_capability = i, str(cc)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    cuda = types.SimpleNamespace(
        Device=Device, is_available=lambda: True,
        get_current_stream=lambda: types.SimpleNamespace(ptr=7),
        runtime=types.SimpleNamespace(getDevice=lambda: 0,
                                      getDeviceProperties=lambda i: props))
    cp.cuda = cuda
    return cp


class FakeKernel:
    def __init__(self, name):
        self.name, self.max_dynamic_shared_size_bytes = name, 48 * 1024


@pytest.fixture
def fake(monkeypatch):
    """A stand-in CuPy and launcher; returns the list of launches (name, grid, block, smem,
    the packed struct as {member: value})."""
    class Launches(list):  # (and per launch, Launcher's dependent flag in .dependent)
        def clear(self):
            super().clear()
            self.dependent.clear()
    launches = Launches()
    dependents = launches.dependent = []

    class Launcher:
        def __init__(self, kernel):
            self.kernel = kernel

        def bind_thread(self):
            pass

        def __call__(self, grid, block, smem, stream, params, dependent=False):
            assert smem <= self.kernel.max_dynamic_shared_size_bytes or smem <= 48 * 1024
            values = {}
            for name, ctype, _, off in params.struct.members:
                values[name] = member_value(ctype, params.buf, off)
            launches.append((self.kernel.name, tuple(grid), block, smem, values))
            dependents.append(dependent)

    cp = _fake_cupy()
    monkeypatch.setattr(_api, "_cupy", lambda: cp)
    monkeypatch.setattr(_loader, "get_kernel", lambda f, name, options=(): FakeKernel(name))
    monkeypatch.setattr(_loader, "Launcher", Launcher)
    for cache in ("_forward_launches", "_backward_launches", "_fa1_launches", "_sm90_grids",
                  "_repeats", "_tail_kept"):
        monkeypatch.setattr(_api, cache, {})
    monkeypatch.setattr(_tma, "_cache", {})
    monkeypatch.setattr(_tma, "_encode", _encode_words)  # (the Hopper kernels' tensor maps)
    monkeypatch.setattr(_api, "_properties", {})
    monkeypatch.setattr(_api, "_capable_devices", set())
    return launches


def _qkv(b, sq, sk, h, hk, d, dtype=np.float16):
    rng = np.random.default_rng(0)
    return (FakeArray(rng.standard_normal((b, sq, h, d)).astype(dtype)),
            FakeArray(rng.standard_normal((b, sk, hk, d)).astype(dtype)),
            FakeArray(rng.standard_normal((b, sk, hk, d)).astype(dtype)))


def _dout_out_lse(q):
    """dout and out (ones) and lse (zeros) for a dense backward call on q's shape."""
    b, sq, h, _ = q.shape
    return (FakeArray(np.ones(q.shape, np.float16)), FakeArray(np.ones(q.shape, np.float16)),
            FakeArray(np.zeros((b, h, sq), np.float32)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,sk", [(64, 700), (64, 5000), (128, 300), (96, 1000)])
def test_forward_packs_every_field_and_plans_the_grid(fake, causal, d, sk):
    q, k, v = _qkv(2, 333, sk, 8, 2, d)
    with _api.portable_kernels():  # (the stand-in GPU is an sm_90 one)
        out, lse = _api.forward(q, k, v, causal=causal)
    ((name, grid, block, smem, p),) = fake
    cfg = _plan.forward_config(_plan.head_dim_bucket(d), causal, 227 * 1024, sk)
    assert name == _plan.forward_kernel_name("float16", cfg, causal)
    assert grid == (-(-333 // cfg.B_r), 8, 2) and block == cfg.threads and smem == cfg.smem_bytes
    assert (p["q"], p["k"], p["v"], p["o"], p["lse"]) == \
        (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, lse.data.ptr)
    assert (p["seqlen_q"], p["seqlen_k"], p["d"], p["group"]) == (333, sk, d, 4)
    assert p["q_stride_s"] == 8 * d and p["k_stride_b"] == sk * 2 * d and p["o_stride_h"] == d
    assert p["softmax_scale"] == pytest.approx(d ** -0.5)
    assert p["scale_log2"] == pytest.approx(d ** -0.5 * np.log2(np.e), rel=1e-6)


def _encode_words(addr, dtype, rank, ptr, dims, strides, box, elem, *modes):
    """A stand-in for cuTensorMapEncodeTiled: the map's bytes are its arguments (data type,
    rank, address, the four sizes, three byte strides, the box and the modes) as int64 words."""
    import ctypes
    words = [dtype, rank, ptr, *dims[:4], *strides[:3], *box[:4], *modes]
    data = struct.pack(f"<{len(words)}q", *words)
    ctypes.memmove(addr, data, len(data))
    return 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [8, 64, 96, 128, 200, 256])
def test_sm90_forward_packs_tensor_maps_and_fields(fake, monkeypatch, causal, d):
    """On an sm_90 GPU the forward launches the Hopper kernel with three tensor maps, each
    encoded from its array's address, (d, seqlen, heads, batch) sizes, byte strides and box,
    and the same fields as the portable forward."""
    monkeypatch.setattr(_tma, "_encode", _encode_words)
    monkeypatch.setattr(_tma, "_cache", {})
    q, k, v = _qkv(2, 333, 700, 8, 2, d, BF16)
    out, lse = _api.forward(q, k, v, causal=causal)
    ((name, grid, block, smem, p),) = fake
    cfg = _plan.sm90_forward_config(d, causal, 700)
    assert name == _plan.sm90_forward_kernel_name("bfloat16", cfg, causal)
    # a persistent grid: min(tiles, SMs) blocks (the stand-in GPU has 132 SMs; at most 48
    # tiles, so one tile per unit of work, causal too); B_r = 64 rows per consumer warpgroup
    assert cfg.B_r == 64 * cfg.consumers and block == 128 * (1 + cfg.consumers)
    assert grid == (min(-(-333 // cfg.B_r) * 8 * 2, 132), 1, 1) and p["per_unit"] == 1
    assert smem == cfg.smem_bytes
    assert (p["nheads"], p["batch"]) == (8, 2)
    # (q's boxes: one consumer warpgroup's 64 rows, each consumer's loaded on their own)
    for field, x, rows in (("tm_q", q, 64), ("tm_k", k, cfg.B_c), ("tm_v", v, cfg.B_c)):
        b, s, h, _ = x.shape
        words = struct.unpack_from("<15q", p[field])
        assert words == (9, 4, x.data.ptr, d, s, h, b, h * d * 2, d * 2, s * h * d * 2,
                         64, rows, 1, 1, 0), field
    assert (p["q"], p["o"], p["lse"]) == (q.data.ptr, out.data.ptr, lse.data.ptr)
    assert (p["seqlen_q"], p["seqlen_k"], p["d"], p["group"]) == (333, 700, d, 4)




def _tail_walk(tiles, grid, T_c, tail):
    """What fa2_forward_sm90.cu's walk gives each block (next_tile, the split tail): a list
    per block of (tile, first block, end block, part) (part -1: whole), in the kernel's
    arithmetic."""
    steps = tail * T_c

    def share(b):
        return b * (steps // grid) + min(b, steps % grid)

    rounds = (tiles - tail) // grid
    walks = []
    for b in range(grid):
        walk = [(b + c * grid, 0, T_c, -1) for c in range(rounds)]
        lo, hi = share(b), share(b + 1)
        for c in range(rounds, rounds + tiles):
            t = lo // T_c + c - rounds
            first, last = max(lo, t * T_c), min(hi, (t + 1) * T_c)
            if first >= last:
                break
            starts_in, ends_in = first > t * T_c, last < (t + 1) * T_c
            part = 2 * b + 1 if starts_in else 2 * (b + 1) if ends_in else -1
            walk.append((tiles - tail + t, first - t * T_c, last - t * T_c, part))
        walks.append(walk)
    return walks


@pytest.mark.parametrize("tiles, sms, T_c", [(2048, 132, 12), (2048, 132, 94), (208, 132, 2),
                                            (272, 132, 5), (1008, 114, 3), (2816, 132, 16)])
def test_split_tail_covers_every_block_once(monkeypatch, tiles, sms, T_c):
    """The split tail (fa2_forward_sm90.cu): the blocks' walks cover every column block of
    every tile exactly once; the tail's shares differ by at most one column block; a split
    tile has exactly two parts, at one boundary (slots 2 b, 2 b + 1), which the merges after
    the tiles find from the share's first step alone; every block's time is at most the even
    share rounded up to a column block."""
    monkeypatch.setattr(_registry, "SPLIT_TAIL_MIN_BLOCKS", 2)  # (every tile length)
    cfg = _plan.sm90_forward_config(128, False)
    T_r = tiles // 16
    grid, per_unit, tail = _registry.sm90_forward_grid(cfg, False, T_r * cfg.B_r, 16, 1, sms,
                                                       T_c * cfg.B_c, True)
    assert per_unit == 1 and grid[0] == sms
    assert tail == sms + tiles % sms and (tiles - tail) % sms == 0
    walks = _tail_walk(tiles, sms, T_c, tail)
    seen = np.zeros((tiles, T_c), int)
    parts = {}
    for b, walk in enumerate(walks):
        for t, kb, ke, part in walk:
            seen[t, kb:ke] += 1
            if part >= 0:
                assert part // 2 in (b, b + 1)
                parts.setdefault(part // 2, []).append((part % 2, t, kb, ke))
    assert (seen == 1).all()
    steps = tail * T_c
    for boundary, got in parts.items():
        assert sorted(p for p, *_ in got) == [0, 1] and len({t for _, t, *_ in got}) == 1
        first = boundary * (steps // sms) + min(boundary, steps % sms)
        assert first % T_c and tiles - tail + first // T_c == got[0][1]
    work = [sum(ke - kb for _, kb, ke, _ in walk) for walk in walks]
    assert max(work) == -(-tiles * T_c // sms)
    assert max(work) - min(work) <= 1


def _causal_walk(T_r, pairs, grid, tail):
    """What fa2_forward_sm90.cu's walk gives each block under the causal mask (next_tile,
    units of rows T_r - 1 - rr and rr, then the causal tail): a list per block of (row
    block, pair), in the kernel's arithmetic."""
    unit_rows = (T_r + 1) // 2
    units = unit_rows * pairs

    def tail_tile(k, b):  # causal_tail_tile
        body = units - tail
        x0, rr0 = divmod(body, unit_rows)
        whole = pairs - 1 - x0
        n1, n2 = rr0 * whole, (T_r - 2 * rr0) * (whole + 1)
        t = k * grid + (grid - 1 - b if k % 2 else b)
        if t >= 2 * n1 + n2:
            return None
        if t < n1:
            return T_r - 1 - t // whole, x0 + 1 + t % whole
        if t < n1 + n2:
            return T_r - 1 - rr0 - (t - n1) // (whole + 1), x0 + (t - n1) % (whole + 1)
        t -= n1 + n2
        return rr0 - 1 - t // whole, x0 + 1 + t % whole

    walks = []
    for b in range(grid):
        walk, c = [], 0
        while True:
            if tail > 0 and c >= (units - tail) // grid * 2:
                got = tail_tile(c - (units - tail) // grid * 2, b)
                c += 1
                if got is None:
                    break
                walk.append(got)
                continue
            u, half = b + c // 2 * grid, c % 2
            if u >= units:
                break
            x, rr = divmod(u, unit_rows)
            c += 1
            if half == 1 and rr == T_r - 1 - rr:
                continue
            walk.append((rr if half else T_r - 1 - rr, x))
        walks.append(walk)
    return walks


@pytest.mark.parametrize("T_r, pairs, sms", [(4, 1024, 132), (8, 512, 132), (16, 256, 132),
                                             (128, 16, 132), (5, 77, 132), (3, 200, 114),
                                             (2, 133, 132), (7, 40, 132), (4, 34, 132)])
def test_causal_tail_covers_every_tile_once(monkeypatch, T_r, pairs, sms):
    """The causal tail (fa2_forward_sm90.cu): the blocks' walks cover every (row block,
    pair) tile exactly once, the tail's tiles go out longest first, and no block's work
    (a tile's length: its row block + 1 column blocks, B_r = B_c, square) passes the even
    share by more than the longest tile, where whole units left up to a unit more."""
    monkeypatch.setattr(_registry, "CAUSAL_TAIL_MIN_ROW_BLOCKS", {64: 1})  # (every length)
    cfg = _plan.sm90_forward_config(64, True, 512)
    assert cfg.B_r == cfg.B_c == 128
    heads = 8 if pairs % 8 == 0 else 1
    grid, per_unit, tail = _registry.sm90_forward_grid(
        cfg, True, T_r * cfg.B_r, heads, pairs // heads, sms, T_r * cfg.B_c, False, True)
    units = (T_r + 1) // 2 * pairs
    assert per_unit == 2 and grid[0] == min(units, sms)
    assert tail == (sms + units % sms if units > sms and units % sms else 0)
    assert tail == 0 or (units - tail) % sms == 0
    walks = _causal_walk(T_r, pairs, grid[0], tail)
    seen = np.zeros((T_r, pairs), int)
    for walk in walks:
        for r, x in walk:
            seen[r, x] += 1
    assert (seen == 1).all()
    work = [sum(r + 1 for r, _ in walk) for walk in walks]
    ideal = pairs * T_r * (T_r + 1) / 2 / grid[0]
    if tail:
        assert max(work) <= ideal + T_r
        old = _causal_walk(T_r, pairs, grid[0], 0)  # (whole units to the end)
        assert max(work) <= max(sum(r + 1 for r, _ in walk) for walk in old)
    else:
        assert max(work) <= ideal + T_r + 1


@pytest.mark.parametrize("d, seqlen, heads, batch, tail", [
    (64, 2048, 32, 8, 0),            # 16 row blocks of 128: below the rule's 17
    (64, 4096, 32, 4, 132 + 1408 % 132),   # 22 row blocks of 192 (units of 2: 11 a pair)
    (128, 2048, 16, 8, 132 + 1024 % 132),  # 16 row blocks
    (128, 1024, 16, 16, 0),          # 8
    (256, 4096, 8, 4, 0),            # 32: below d 256's 64
    (256, 8192, 8, 2, 132 + 512 % 132),
    (128, 2048, 33, 4, 0),           # 1056 units: whole rounds
])
def test_sm90_forward_grid_causal_tail_rule(d, seqlen, heads, batch, tail):
    """The causal tail where it measured faster: pairs of at least
    CAUSAL_TAIL_MIN_ROW_BLOCKS row blocks (by head-dim bucket), the units not in whole
    rounds."""
    cfg = _plan.sm90_forward_config(d, True, seqlen)
    _, per_unit, got = _registry.sm90_forward_grid(cfg, True, seqlen, heads, batch, 132,
                                                   seqlen, False, True)
    assert per_unit == 2 and got == tail
    _, _, off = _registry.sm90_forward_grid(cfg, True, seqlen, heads, batch, 132, seqlen)
    assert off == 0  # (without causal_tail: a window, or not causal)


@pytest.mark.parametrize("d, causal, split, tiles, T_c, tail", [
    (128, False, True, 2048, 47, 200),
    (128, False, True, 2048, 32, 200),
    (64, False, True, 2048, 32, 200),
    (128, False, True, 2048, 31, 0),     # below SPLIT_TAIL_MIN_BLOCKS
    (256, False, True, 2048, 94, 0),     # above SPLIT_TAIL_MAX_HEAD_DIM
    (128, True, True, 2048, 47, 0),      # causal: no split (the causal tail, above)
    (128, False, False, 2048, 47, 0),    # a window or the score hook: no split tail
    (128, False, True, 2112, 47, 0),     # whole rounds
    (128, False, True, 112, 47, 0),      # fewer tiles than blocks
])
def test_sm90_forward_grid_splits_the_tail(d, causal, split, tiles, T_c, tail):
    cfg = _plan.sm90_forward_config(d, causal)
    grid, _, got = _registry.sm90_forward_grid(cfg, causal, tiles // 16 * cfg.B_r, 16, 1, 132,
                                               T_c * cfg.B_c - 5, split)
    assert got == (tail and 132 + tiles % 132) and grid == (min(tiles, 132), 1, 1)


@pytest.mark.parametrize("options, split", [({}, True), ({"causal": True}, False),
                                            ({"causal": True, "softcap": 5.0}, False),
                                            ({"softcap": 5.0}, False),
                                            ({"window_size": (64, 64)}, False),
                                            ({"causal": True, "window_size": (64, 0)}, False)])
def test_sm90_forward_passes_the_split_tail(fake, options, split):
    """A dense Hopper forward call without a causal mask, a window or the hook, whose tiles
    do not fill whole rounds of the grid, launches with the split tail: its tile count and
    its buffers (per stream, kept: a second call gets the same ones, the counts zeroed once),
    and its repeat launches them too. Causal without a window (the hook or not), the causal
    tail: its unit count, no buffers."""
    q, k, v = _qkv(2, 128 * 70, 6001, 2, 2, 128, BF16)  # 280 tiles of 128 rows on 132 SMs
    for _ in range(3):  # (the third: the repeat path)
        _api.forward(q, k, v, **options)
    assert len(fake) == 3
    ps = [p for *_, p in fake]
    cfg = _plan.sm90_forward_config(128, options.get("causal", False), 6001,
                                    local="window_size" in options)
    if not split:
        # causal: 140 units of two tiles (T_r 70, 4 pairs) on 132 SMs, the last 140 single
        causal_tail = options.get("causal") and "window_size" not in options
        assert all(p["tail_tiles"] == (140 if causal_tail else 0) and p["tail_parts"] == 0
                   for p in ps)
        assert not causal_tail or all(p["per_unit"] == 2 for p in ps)
        return
    assert cfg.B_r == 128 and all(p["tail_tiles"] == 132 + 280 % 132 for p in ps)
    assert all(p["tail_parts"] == ps[0]["tail_parts"] != 0 for p in ps)
    assert all(p["tail_flags"] == ps[0]["tail_flags"] != 0 for p in ps)
    ((parts, flags),) = _api._tail_kept.values()
    assert (parts.size, flags.size) == _registry.sm90_tail_buffers(cfg, 132)
    assert flags.dtype == np.int32 and not flags.a.any()  # (zeros: cupy.zeros)
    # Allocating nothing (cuflash.jax's callbacks): no split tail, its own repeat
    with _api._allocation_free():
        for _ in range(3):
            _api.forward(q, k, v, **options)
    assert all(p["tail_tiles"] == 0 and p["tail_parts"] == 0 for *_, p in fake[3:])
    assert len(fake) == 6 and len(_api._tail_kept) == 1
    _api.forward(q, k, v, **options)  # (and outside again: the split tail's repeat)
    assert fake[-1][-1]["tail_tiles"] == 132 + 280 % 132


def test_split_tail_buffers_per_stream(fake, monkeypatch):
    """The split tail's buffers are kept per GPU and stream, per host thread on the
    per-thread default stream (whose handle threads share), at most _TAIL_STREAMS of them;
    a launch that needs more than a stream's buffers gets larger ones."""
    import threading
    cp = _api._cupy()
    monkeypatch.setattr(cp.cuda, "ExternalStream", lambda ptr: contextlib.nullcontext(),
                        raising=False)
    cfg = _plan.sm90_forward_config(128, False)
    one, two = (_registry.sm90_tail_buffers(cfg, grid) for grid in (132, 264))
    a = _api._tail_buffers(cp, 0, 7, one)
    assert _api._tail_buffers(cp, 0, 7, one) == a
    assert _api._tail_buffers(cp, 0, 8, one) != a  # another stream
    assert _api._tail_buffers(cp, 1, 7, one) != a  # another GPU
    mine = _api._tail_buffers(cp, 0, 2, one)
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(_api._tail_buffers(cp, 0, 2, one)))
    t.start()
    t.join()
    assert theirs[0] != mine and _api._tail_buffers(cp, 0, 2, one) == mine
    bigger = _api._tail_buffers(cp, 0, 7, two)
    assert bigger != a and _api._tail_buffers(cp, 0, 7, one) == bigger
    for stream in range(100, 100 + 2 * _api._TAIL_STREAMS):
        _api._tail_buffers(cp, 0, stream, one)
    assert len(_api._tail_kept) == _api._TAIL_STREAMS


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("options", [{}, {"causal": True, "window_size": (50, 0),
                                          "softcap": 5.0, "softmax_scale": 0.1}])
def test_repeated_forward_packs_what_the_full_path_packs(fake, monkeypatch, portable,
                                                         options):
    """A call with the signature of an earlier one launches the remembered kernel with the
    struct the full path would pack for its own arrays: every field, the tensor maps of its
    addresses included; given outputs too."""
    monkeypatch.setattr(_tma, "_encode", _encode_words)
    monkeypatch.setattr(_tma, "_cache", {})
    context = _api.portable_kernels if portable else contextlib.nullcontext

    def call(given=False):
        q, k, v = _qkv(2, 333, 700, 8, 2, 128, BF16)
        outs = dict(out=FakeArray(np.zeros(q.shape, BF16)),
                    lse=FakeArray(np.zeros((2, 8, 333), np.float32))) if given else {}
        if given == "out":
            del outs["lse"]
        with context():
            out, lse = _api.forward(q, k, v, **options, **outs)
        return fake[-1], (q, k, v, out, lse)

    full_calls = []
    full_path = _api._forward_outputs
    monkeypatch.setattr(_api, "_forward_outputs",
                        lambda *a: full_calls.append(1) or full_path(*a))
    for count, given in enumerate((False, "out", True)):
        call(given)                       # the full path, remembered
        assert len(_api._repeats) == 1 + min(count, 1)  # (this call's, and the last full call's)
        before = len(full_calls)
        repeat, arrays = call(given)      # a repeat on new arrays
        assert len(full_calls) == before  # (it did not take the full path)
        monkeypatch.setattr(_api, "_repeats", {})
        q, k, v, out, lse = arrays        # ... and the same arrays on the full path
        passed = {} if not given else {"out": out} if given == "out" else \
            {"out": out, "lse": lse}
        with context():  # (an output not given: the full path allocates its own)
            _api.forward(q, k, v, **options, **passed)
        full = fake[-1]
        p = repeat[4]
        full[4].update({"o": p["o"]} if "out" not in passed else {},
                       **({"lse": p["lse"]} if "lse" not in passed else {}))
        assert repeat == full
        assert (p["q"], p["k"], p["v"], p["o"], p["lse"]) == \
            tuple(x.data.ptr for x in arrays)
        if not portable:
            assert [struct.unpack_from("<q", p[f], 16)[0] for f in ("tm_q", "tm_k", "tm_v")] == \
                [q.data.ptr, k.data.ptr, v.data.ptr]
    assert len({name for name, *_ in fake}) == 1  # (one kernel: the family asked for)


def test_repeated_forward_keeps_every_check(fake, monkeypatch):
    """What may differ between calls of one signature is still checked on a repeat: the
    arrays' types, the flags' types, alignment (a misaligned q is copied, as on the full path)
    and outputs that overlap the inputs; portable_kernels() is part of the signature."""
    monkeypatch.setattr(_tma, "_encode", _encode_words)
    monkeypatch.setattr(_tma, "_cache", {})
    q, k, v = _qkv(1, 64, 64, 2, 2, 64, BF16)
    out, lse = _api.forward(q, k, v, causal=True)
    _api.forward(q, k, v, causal=True)
    assert len(_api._repeats) == 1 and len(fake) == 2
    with pytest.raises(TypeError, match="causal must be a bool"):
        _api.forward(q, k, v, causal=1)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        _api.forward(q.a, k, v, causal=True)
    with pytest.raises(ValueError, match="out shares memory with q"):
        _api.forward(q, k, v, causal=True, out=FakeArray(q.a.copy(), q.data.ptr))
    assert len(fake) == 2
    # q at an address off the 16-byte grid: the full path's aligned copy is launched
    odd = FakeArray(q.a.copy(), q.data.ptr + (1 << 20) + 2)
    _api.forward(odd, k, v, causal=True)
    assert fake[-1][4]["q"] % 16 == 0 and fake[-1][4]["q"] != odd.data.ptr
    with _api.portable_kernels():
        _api.forward(q, k, v, causal=True)
    assert fake[-1][0] != fake[0][0] and "sm90" not in fake[-1][0]
    _api.forward(q, k, v, causal=True)
    assert fake[-1][0] == fake[0][0]
    with pytest.raises(TypeError, match="algorithm must be"):
        _api.forward(q, k, v, causal=True, algorithm=np.array("fa2"))
    # k on another GPU than q (the signature names q's)
    k1 = FakeArray(k.a.copy())
    k1.data.device_id = 1
    with pytest.raises(ValueError, match="same GPU"):
        _api.forward(q, k1, v, causal=True)
    # given outputs: remembered with good ones, then on a repeat an out over q, an out and an
    # lse off their alignment
    def outs(out_ptr=None, lse_ptr=None):
        return dict(out=FakeArray(np.zeros(q.shape, BF16), out_ptr),
                    lse=FakeArray(np.zeros((1, 2, 64), np.float32), lse_ptr))
    _api.forward(q, k, v, causal=True, **outs())
    n = len(fake)
    _api.forward(q, k, v, causal=True, **outs())
    assert len(fake) == n + 1
    with pytest.raises(ValueError, match="out shares memory with q"):
        _api.forward(q, k, v, causal=True, **outs(out_ptr=q.data.ptr + 64))
    with pytest.raises(ValueError, match="lse shares memory with v"):
        _api.forward(q, k, v, causal=True, **outs(lse_ptr=v.data.ptr))
    with pytest.raises(ValueError, match="out must start on a 16-byte boundary"):
        _api.forward(q, k, v, causal=True, **outs(out_ptr=(1 << 40) + 8))
    with pytest.raises(ValueError, match="lse must start on a 4-byte boundary"):
        _api.forward(q, k, v, causal=True, **outs(lse_ptr=(1 << 40) + 2))
    assert len(fake) == n + 1


def _counting_encoder(monkeypatch) -> list:
    """The stand-in tensor-map encoder, with an empty map cache; returns the list of the
    addresses it is asked to encode, in order."""
    encoded = []

    def encoder(addr, dtype, rank, ptr, *rest):
        encoded.append(ptr)
        return _encode_words(addr, dtype, rank, ptr, *rest)
    monkeypatch.setattr(_tma, "_encode", encoder)
    monkeypatch.setattr(_tma, "_cache", {})
    return encoded


def test_repeated_forward_on_seen_addresses_launches_its_kept_struct(fake, monkeypatch):
    """With out and lse given (cuflash.jax's callbacks), a repeat on the five addresses of an
    earlier repeat launches that one's struct without checking or packing them again (they
    depend on the addresses alone); other addresses are checked and packed afresh, the
    arrays' GPU is checked on every call, and the kept structs are bounded."""
    encoded = _counting_encoder(monkeypatch)
    q, k, v = _qkv(1, 64, 64, 2, 2, 128, BF16)

    def outs():
        return dict(out=FakeArray(np.zeros(q.shape, BF16)),
                    lse=FakeArray(np.zeros((1, 2, 64), np.float32)))
    _api.forward(q, k, v, causal=True, **outs())  # the full path, remembered
    given = outs()
    _api.forward(q, k, v, causal=True, **given)  # a repeat: checked, packed, kept
    ((_, rep),) = _api._repeats.items()
    assert list(rep.filled) == [(q.data.ptr, k.data.ptr, v.data.ptr, given["out"].data.ptr,
                                 given["lse"].data.ptr)]
    monkeypatch.setattr(_tma, "_cache", {})
    overlap = _api._Repeat._overlap
    monkeypatch.setattr(_api._Repeat, "_overlap", lambda *a: pytest.fail("checked again"))
    n = len(encoded)
    _api.forward(q, k, v, causal=True, **given)  # seen addresses: straight to the launch
    assert len(encoded) == n and fake[-1] == fake[-2]
    monkeypatch.setattr(_api._Repeat, "_overlap", overlap)
    other = outs()  # new addresses: packed afresh, and what the full path packs
    _api.forward(q, k, v, causal=True, **other)
    repeat = fake[-1]
    assert (repeat[4]["o"], repeat[4]["lse"]) == (other["out"].data.ptr,
                                                  other["lse"].data.ptr)
    monkeypatch.setattr(_api, "_repeats", {})
    _api.forward(q, k, v, causal=True, **other)
    assert fake[-1] == repeat
    _api.forward(q, k, v, causal=True, **other)  # (remembered again, and repeated)
    _api.forward(q, k, v, causal=True, **other)
    assert fake[-1] == repeat
    k.data.device_id = 1  # the same addresses, k now on another GPU: refused
    with pytest.raises(ValueError, match="same GPU"):
        _api.forward(q, k, v, causal=True, **other)
    k.data.device_id = 0
    ((_, rep),) = _api._repeats.items()
    for _ in range(40):
        _api.forward(q, k, v, causal=True, **outs())
    assert 0 < len(rep.filled) <= 16


@pytest.mark.parametrize("portable", [False, True])
def test_repeated_forward_on_a_pools_addresses_launches_its_kept_struct(fake, monkeypatch,
                                                                       portable):
    """With out and lse allocated, a repeat whose two allocations land where an earlier
    repeat's did (CuPy's pool does that for a caller that dropped them) launches that one's
    struct without packing it again: the struct the full path packs for those arrays. A repeat
    whose allocations land elsewhere packs its own."""
    encoded = _counting_encoder(monkeypatch)
    monkeypatch.setattr(FakeArray, "_next", [1 << 36])
    context = _api.portable_kernels if portable else contextlib.nullcontext
    q, k, v = _qkv(1, 64, 64, 2, 2, 128, BF16)
    pool = FakeArray._next[0]

    def call(same_blocks=True):
        if same_blocks:
            FakeArray._next[0] = pool
        with context():
            return _api.forward(q, k, v, causal=True)
    call()  # the full path, remembered
    call()  # a repeat: packed, kept under its five addresses
    ((_, rep),) = _api._repeats.items()
    packed = fake[-1]
    monkeypatch.setattr(_tma, "_cache", {})
    n = len(encoded)
    out, lse = call()  # the same blocks: straight to the kept struct
    assert len(encoded) == n and fake[-1] == packed and len(rep.filled) == 1
    assert (packed[4]["o"], packed[4]["lse"]) == (out.data.ptr, lse.data.ptr)
    out2, lse2 = call(same_blocks=False)  # other blocks: packed for them
    assert (fake[-1][4]["o"], fake[-1][4]["lse"]) == (out2.data.ptr, lse2.data.ptr)
    assert out2.data.ptr != out.data.ptr and len(rep.filled) == 2
    monkeypatch.setattr(_api, "_repeats", {})
    call()  # the full path on the first blocks packs the kept struct
    assert fake[-1] == packed


def test_unhashable_option_takes_the_full_path_and_its_message(fake, monkeypatch):
    """An option that cannot be hashed (the repeat lookup's key) is no repeat: the full path
    says what is wrong with it."""
    monkeypatch.setattr(_tma, "_encode", _encode_words)
    monkeypatch.setattr(_tma, "_cache", {})
    q, k, v = _qkv(1, 64, 64, 2, 2, 64, BF16)
    _api.forward(q, k, v, softcap=1.0)
    with pytest.raises(ValueError, match="softcap must be"):
        _api.forward(q, k, v, softcap=[1.0])
    assert len(_api._repeats) == 1


def test_repeated_forward_restores_its_whole_struct(fake, monkeypatch):
    """Another call of the same kernel (another length and scale) packs the shared parameter
    buffer in between: a repeat launches with every field of its own call, not the last."""
    monkeypatch.setattr(_tma, "_encode", _encode_words)
    monkeypatch.setattr(_tma, "_cache", {})
    q, k, v = _qkv(1, 300, 300, 2, 2, 128, BF16)
    _api.forward(q, k, v)
    first = fake[-1]
    q2, k2, v2 = _qkv(1, 280, 290, 2, 2, 128, BF16)
    _api.forward(q2, k2, v2, softmax_scale=0.05)
    assert fake[-1][0] == first[0] and fake[-1][4]["seqlen_q"] == 280  # (the same kernel)
    out, lse = _api.forward(q, k, v)
    assert fake[-1][4] == dict(first[4], o=out.data.ptr, lse=lse.data.ptr)
    assert len(_api._repeats) == 2


def test_sm90_forward_takes_an_explicit_tile(fake, monkeypatch):
    """The bench's Hopper tile (an Sm90ForwardConfig passed to _forward) is the one launched;
    on a GPU that is not sm_90 it is refused."""
    monkeypatch.setattr(_tma, "_encode", lambda addr, *a: 0)
    monkeypatch.setattr(_tma, "_cache", {})
    q, k, v = _qkv(1, 300, 300, 4, 4, 128, BF16)
    cfg = _plan.Sm90ForwardConfig(128, 176, 2)
    _api._forward(q, k, v, False, None, None, None, "fa2", False, cfg)
    ((name, grid, block, smem, _),) = fake
    assert name == _plan.sm90_forward_kernel_name("bfloat16", cfg, False)
    assert smem == cfg.smem_bytes and block == 384
    monkeypatch.setattr(_api, "_cupy", lambda: _fake_cupy(cc=80))
    monkeypatch.setattr(_api, "_properties", {})
    monkeypatch.setattr(_api, "_capable_devices", set())
    with pytest.raises(ValueError, match="sm_90"):
        _api._forward(q, k, v, False, None, None, None, "fa2", False, cfg)


def test_fa1_launches_main_and_finalize_on_one_struct(fake):
    q, k, v = _qkv(1, 200, 300, 4, 4, 128, BF16)
    out, lse = _api.forward(q, k, v, causal=True, algorithm="fa1")
    (main, fin) = fake
    cfg = _plan.fa1_config(128, 227 * 1024)
    assert main[0] == _plan.fa1_kernel_name("bfloat16", cfg, True)
    assert main[1] == (4, 1, 1) and main[3] == cfg.smem_bytes
    assert fin[0] == _plan.fa1_finalize_name("bfloat16") and fin[3] == 0
    for p in (main[4], fin[4]):
        assert p["o"] == out.data.ptr and p["lse"] == lse.data.ptr and p["o_accum"] != 0


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch,n,parts", [(4, 4096, 1), (2, 1000, 4)])
def test_backward_packs_one_struct_for_its_three_kernels(fake, causal, deterministic, batch,
                                                          n, parts):
    """32 kv column blocks x 2 kv heads x batch 4 fill the SMs: one part per kv head, dK and
    dV written by the kernel; 8 x 2 x 2 do not: the group of 4 in 4 parts, float32 slices."""
    q, k, v = _qkv(batch, n, n, 8, 2, 128)
    dout, out = FakeArray(np.ones(q.shape, np.float16)), FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((batch, 8, n), np.float32))
    with _api.portable_kernels():  # (the stand-in GPU is an sm_90 one)
        dq, dk, dv = _api.backward(dout, q, k, v, out, lse, causal=causal,
                                   deterministic=deterministic)
    pre, main, fin = fake
    cfg = _plan.backward_config(128, 227 * 1024, True)
    ordered = deterministic
    assert main[0] == _plan.backward_kernel_name("float16", cfg, causal, ordered)
    assert fin[0] == _plan.backward_dq_name("float16", cfg, causal)
    T_c = -(-n // cfg.B_c)
    assert main[1] == _registry.backward_grid(T_c, 2 * parts, batch, causal, ordered)
    assert main[3] == cfg.smem_bytes
    assert pre[4] == main[4] == fin[4]  # one packing
    p = main[4]
    assert (p["q"], p["dout"], p["o"], p["lse"]) == \
        (q.data.ptr, dout.data.ptr, out.data.ptr, lse.data.ptr)
    assert p["dq"] == dq.data.ptr
    assert ((p["dk"], p["dv"]) == (dk.data.ptr, dv.data.ptr)) == (parts == 1)
    assert (p["nheads"], p["group"], p["head_parts"], p["deterministic"]) == \
        (8, 4, parts, int(deterministic))
    assert (p["dq_order"] != 0) == ordered and p["dq_accum_cols"] == cfg.HD


def test_backward_with_dq_atomics_and_splits(fake, monkeypatch):
    """sm_80's path (no bulk copies, 163 KB): the deterministic mode's split slices."""
    cp = _fake_cupy(sms=108, smem=163 * 1024, cc=80)
    monkeypatch.setattr(_api, "_cupy", lambda: cp)
    q, k, v = _qkv(1, 2000, 2000, 4, 4, 64)
    dout, out = FakeArray(np.ones(q.shape, np.float16)), FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((1, 4, 2000), np.float32))
    _api.backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    pre, main, fin = fake
    cfg = _plan.backward_config(64, 163 * 1024, False)
    assert cfg.dq_bulk == 0 and main[0] == _plan.backward_kernel_name("float16", cfg, True)
    p = main[4]
    assert p["splits"] >= 1 and main[1][0] == p["splits"] and p["dq_order"] == 0
    assert fin[1] == _registry.backward_dq_grid(cfg, 2000, 64, 4, 1)


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_carves_its_scratch_from_a_given_arena(fake, deterministic):
    """With scratch= (cuflash.jax's XLA-owned buffer), D, the dQ sums, the turn counters and
    the GQA parts' slices are views of the arena, of the size _backward_scratch_bytes
    predicts; a smaller arena is refused."""
    q, k, v = _qkv(1, 500, 500, 8, 1, 128)  # MQA, one batch entry: the heads go in parts
    dout, out = FakeArray(np.ones(q.shape, np.float16)), FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((1, 8, 500), np.float32))
    nbytes = _api._backward_scratch_bytes(q.shape, k.shape, True, (-1, -1), 0.0, None,
                                          deterministic)
    arena = FakeArray(np.zeros(nbytes, np.uint8))
    with _api.portable_kernels():  # (the stand-in GPU is an sm_90 one; the Hopper family's
        # scratch: test_sm90_backward_packs_one_struct_for_its_three_kernels)
        _api._backward(dout, q, k, v, out, lse, True, None, deterministic, None, None, None,
                       None, scratch=arena)
    pre, main, fin = fake
    p = main[4]
    inside = range(arena.data.ptr, arena.data.ptr + nbytes)
    assert p["head_parts"] > 1 and p["dk"] in inside and p["dv"] in inside
    assert p["dsum"] in inside and p["dq_accum"] in inside
    assert (p["dq_order"] in inside) == deterministic
    del fake[:]
    with pytest.raises(ValueError, match="scratch needs"), _api.portable_kernels():
        _api._backward(dout, q, k, v, out, lse, True, None, deterministic, None, None, None,
                       None, scratch=FakeArray(np.zeros(nbytes - 1, np.uint8)))


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_sm90_backward_packs_one_struct_for_its_three_kernels(fake, causal, d, deterministic):
    """On an sm_90 GPU a dense call with d <= 128 runs the Hopper backward: the padded
    preprocess, the main kernel over (column blocks, kv heads, batch) with four tensor maps
    (q, k, v, dout at their own addresses and strides), the dQ pass; one struct, its scratch
    (padded D and L log2 e, the dQ sums; deterministic: the turn and ticket counters, and the
    grid (H, column blocks, pairs / H) over the 4 (batch, kv head) pairs without the causal
    mask, here H = 4) carved from a given arena
    of the size _backward_scratch_bytes predicts."""
    q, k, v = _qkv(2, 333, 517, 8, 2, d)
    dout, out = FakeArray(np.ones(q.shape, np.float16)), FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((2, 8, 333), np.float32))
    nbytes = _api._backward_scratch_bytes(q.shape, k.shape, causal, (-1, -1), 0.0, None,
                                          deterministic)
    arena = FakeArray(np.zeros(nbytes, np.uint8))
    dq, dk, dv = _api._backward(dout, q, k, v, out, lse, causal, None, deterministic, None,
                                None, None, None, scratch=arena)
    pre, main, fin = fake
    assert fake.dependent == [False, True, True]  # (the main kernel and the dQ pass: each the
    # one before's dependent launch)
    cfg = _plan.sm90_backward_config(d, ordered=deterministic)
    names = _plan.sm90_backward_names("float16", cfg, causal, ordered=deterministic)
    assert (pre[0], main[0], fin[0]) == (names["pre"], names["main"], names["dq"])
    T_c = -(-517 // cfg.B_c)
    # (without a mask, deterministic or not: a 1-d grid over the tiles, the split tail's;
    # unsplit here, as a call on a given arena allocates nothing)
    # causal, not deterministic: (kv heads, column blocks, batch), the longest tiles first
    assert main[1] == ((4, T_c, 1) if deterministic and not causal else (T_c, 2, 2)
                       if deterministic else (2, T_c, 2) if causal else (T_c * 4, 1, 1))
    assert main[4]["tail_parts"] == 1
    assert main[2] == 384
    assert main[3] == cfg.smem_bytes
    rows = -(-333 // 64) * 64
    assert pre[1][0] * (128 // pre[4]["lanes"]) >= rows  # (the padded rows)
    assert fin[1] == _registry.backward_dq_grid(cfg, 333, d, 8, 2)
    assert pre[4] == main[4] == fin[4]  # one packing
    p = main[4]
    assert (p["q"], p["dout"], p["o"], p["lse"], p["dq"], p["dk"], p["dv"]) == \
        (q.data.ptr, dout.data.ptr, out.data.ptr, lse.data.ptr, dq.data.ptr, dk.data.ptr,
         dv.data.ptr)
    inside = range(arena.data.ptr, arena.data.ptr + nbytes)
    assert p["dsum"] in inside and p["lse_log2"] in inside and p["dq_accum"] in inside
    assert (p["group"], p["head_parts"], p["deterministic"], p["dq_accum_cols"]) == \
        (4, 1, int(deterministic), cfg.HD)
    assert (p["dq_order"] in inside) if deterministic else p["dq_order"] == 0
    for name, x in (("tm_q", q), ("tm_k", k), ("tm_v", v), ("tm_do", dout)):
        words = struct.unpack_from("<16q", p[name])
        assert words[2] == x.data.ptr, name  # (_encode_words: the map's address word)
        assert words[10] == 64 and words[11] == (cfg.B_c if name in ("tm_k", "tm_v")
                                                 else cfg.B_r), name  # (the box)


def _backward_split_walk(tiles, steps, sms):
    """The blocks of fa2_backward_sm90.cu's 1-d grid under sm90_backward_split's choice, as
    the kernel maps them: (tile, first step, end step) each."""
    whole, parts = _registry.sm90_backward_split(tiles, steps, sms)
    walk = []
    for b in range(whole + (tiles - whole) * parts):
        tile, part, n = b, 0, 1
        if b >= whole:
            tile, part, n = whole + (b - whole) // parts, (b - whole) % parts, parts
        walk.append((tile, part * steps // n, (part + 1) * steps // n))
    return whole, parts, walk


@pytest.mark.parametrize("tiles, steps, sms, expect", [
    (2048, 256, 132, (1980, 7)),   # d 128, 16k tokens, n 16k: 68 tiles left over, 7 parts
    (2048, 32, 132, (1980, 3)),    # n 2048
    (2048, 8, 132, (2048, 1)),     # n 512: parts would cost more than they save
    (4096, 32, 132, (4092, 32)),   # d 64, n 2048: 4 tiles left over, 32 parts
    (4096, 8, 132, (4092, 8)),     # one step a part
    (2112, 256, 132, (2112, 1)),   # whole rounds
    (16, 36, 132, (0, 8)),         # fewer tiles than SMs
    (7, 1, 132, (7, 1)),           # one step: nothing to split
])
def test_sm90_backward_split_covers_every_step_once(tiles, steps, sms, expect):
    """The Hopper backward's split tail: the last tiles' row steps, in parts, each taken by
    one block, every step of every tile exactly once, no part empty; the parts chosen so that
    the parts' rounds end soonest (SPLIT_PART_COST more steps a part)."""
    whole, parts, walk = _backward_split_walk(tiles, steps, sms)
    assert (whole, parts) == expect
    assert parts == 1 or whole == tiles - tiles % sms
    seen = np.zeros((tiles, steps), int)
    for tile, t0, t1 in walk:
        assert t1 > t0
        seen[tile, t0:t1] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize("options, split", [({}, True), ({"softcap": 5.0}, True),
                                            ({"causal": True}, False),
                                            ({"window_size": (64, 64)}, False),
                                            ({"deterministic": True}, False)])
def test_sm90_backward_passes_the_split_tail(fake, options, split):
    """A dense Hopper backward without a mask, a window or the deterministic mode runs on a
    1-d grid over its tiles (column block, kv head, batch), the last ones split by row steps
    where the last round of blocks is part empty: 136 tiles on 132 SMs, 4 left over, 16 parts
    of one step each; the buffers the stream's (kept: a second call gets the same ones, zeroed
    once). Allocating nothing (cuflash.jax's callbacks): the same grid, unsplit."""
    q, k, v = _qkv(1, 1024, 1024, 17, 17, 128)  # 8 column blocks x 17 heads, 16 row blocks
    dout, out, lse = _dout_out_lse(q)
    for _ in range(2):
        _api.backward(dout, q, k, v, out, lse, **options)
    mains = [launch for launch in fake if "fa2_backward_sm90<" in launch[0]]
    assert len(mains) == 2
    if not split:
        assert all(m[1][1:] != (1, 1) and m[4]["tail_parts"] == 1 for m in mains)
        assert not _api._tail_kept
        return
    assert all(m[1] == (132 + 4 * 16, 1, 1) for m in mains)
    ps = [m[4] for m in mains]
    assert all((p["tail_whole"], p["tail_parts"]) == (132, 16) for p in ps)
    assert ps[0]["tail_acc"] == ps[1]["tail_acc"] != 0
    assert ps[0]["tail_flags"] == ps[1]["tail_flags"] != 0
    ((key, (acc, flags)),) = _api._tail_kept.items()
    cfg = _plan.sm90_backward_config(128, hooked="softcap" in options)
    assert key[0] == "backward"
    assert (acc.size, flags.size) == _registry.sm90_backward_tail_buffers(cfg, 132, 136)
    assert not acc.a.any() and not flags.a.any()  # (zeros: cupy.zeros)
    del fake[:]
    with _api._allocation_free():
        _api.backward(dout, q, k, v, out, lse, **options)
    main = [launch for launch in fake if "fa2_backward_sm90<" in launch[0]][0]
    assert main[1] == (136, 1, 1) and main[4]["tail_parts"] == 1


def test_split_tails_stay_off_while_a_stream_is_captured(fake):
    """A stream being captured into a CUDA graph: the forward and the backward launch whole
    tiles and allocate no split-tail buffers (the graph would hold their zeroing instead of
    running it); the forward's repeat falls back to the full path. Outside the capture both
    split; captured again, they leave the kept buffers out too (grown or let go later, they
    would be freed under the graph), and a query that fails counts as a capture."""
    q, k, v = _qkv(1, 1024, 1024, 17, 17, 128)  # backward: 136 tiles on 132 SMs
    dout = FakeArray(np.ones(q.shape, np.float16))
    qf, kf, vf = _qkv(2, 128 * 70, 6001, 2, 2, 128, BF16)  # forward: 280 tiles
    runtime = _api._cupy().cuda.runtime
    runtime.streamIsCapturing = lambda stream: 1
    try:
        for _ in range(3):  # (the third: the repeat path)
            _api.forward(qf, kf, vf)
        out, lse = _api.forward(q, k, v)
        _api.backward(dout, q, k, v, out, lse)
        assert not _api._tail_kept
        assert all(p["tail_tiles"] == 0 for name, *_, p in fake if "forward_sm90<" in name)
        mains = [p for name, *_, p in fake if "fa2_backward_sm90<" in name]
        assert [p["tail_parts"] for p in mains] == [1]
        del fake[:]
        runtime.streamIsCapturing = lambda stream: 0
        _api.forward(qf, kf, vf)
        _api.backward(dout, q, k, v, out, lse)
        runtime.streamIsCapturing = lambda stream: True
        _api.forward(qf, kf, vf)
        _api.backward(dout, q, k, v, out, lse)

        def failing(stream):
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")
        runtime.streamIsCapturing = failing
        _api.forward(qf, kf, vf)
        _api.backward(dout, q, k, v, out, lse)
    finally:
        del runtime.streamIsCapturing
    assert len(_api._tail_kept) == 2
    fwd = [p["tail_tiles"] for name, *_, p in fake if "forward_sm90<" in name]
    assert fwd == [132 + 280 % 132, 0, 0]
    assert [p["tail_parts"] for name, *_, p in fake if "fa2_backward_sm90<" in name] == \
        [16, 1, 1]


def test_sm90_causal_backward_past_its_grid_takes_the_portable_one(fake, monkeypatch):
    """The Hopper backward's causal grid holds the column blocks in y (at most 65535; here
    lowered to 4): a causal call with more runs the portable backward, deterministic or not,
    and a call within the limit the Hopper one."""
    monkeypatch.setattr(_registry, "GRID_YZ_MAX", 4)
    for sk, hopper in ((512, True), (513, False)):
        q, k, v = _qkv(1, 300, sk, 2, 2, 64)
        dout, out, lse = _dout_out_lse(q)
        del fake[:]
        _api.backward(dout, q, k, v, out, lse, causal=True)
        assert ("fa2_backward_sm90<" in fake[1][0]) == hopper, sk


def test_sm90_backward_leaves_other_calls_to_the_portable_one(fake):
    """d 256 and d 59: the portable backward, on an sm_90 GPU too."""
    for d in (256, 59):
        q, k, v = _qkv(1, 200, 200, 2, 2, d)
        dout, out, lse = _dout_out_lse(q)
        del fake[:]
        _api.backward(dout, q, k, v, out, lse, causal=True)
        assert "fa2_backward<" in fake[1][0], d


@pytest.mark.parametrize("d", [64, 128])
def test_sm90_backward_takes_the_hook(fake, d):
    """The softcap and ALiBi at d <= 128 run the Hopper backward's hooked kernel, the hook's
    fields in its struct (softcap 20: softcap_in = scale / 20, softcap_out = 20 / scale; the
    slopes' pointer), deterministic or not."""
    slopes = FakeArray(np.full((2,), 0.5, np.float32))
    for kwargs in ({"softcap": 20.0}, {"alibi_slopes": slopes},
                   {"softcap": 20.0, "alibi_slopes": slopes, "deterministic": True}):
        q, k, v = _qkv(1, 200, 200, 2, 2, d)
        dout, out, lse = _dout_out_lse(q)
        del fake[:]
        _api.backward(dout, q, k, v, out, lse, causal=True, **kwargs)
        ordered = kwargs.get("deterministic", False)
        cfg = _plan.sm90_backward_config(d, ordered=ordered, hooked=True)
        main = fake[1]
        assert main[0] == _plan.sm90_backward_names("float16", cfg, True, ordered=ordered,
                                                    hooked=True)["main"], kwargs
        assert main[0].endswith(", cuflash::ScoreHook>")
        p, scale = main[4], d ** -0.5
        if "softcap" in kwargs:
            assert p["softcap_in"] == pytest.approx(scale / 20.0)
            assert p["softcap_out"] == pytest.approx(20.0 / scale)
            assert p["softcap_log2"] == pytest.approx(20.0 * np.log2(np.e))  # (cap log2 e)
        else:
            assert p["softcap_in"] == 0.0
        assert p["alibi_slopes"] == (slopes.data.ptr if "alibi_slopes" in kwargs else 0)


@pytest.mark.parametrize("d, causal, n, expect", [
    (64, True, 2048, (128, 4, 2)),    # short keys: the plain call's short tile
    (64, True, 8192, (128, 3, 3)),    # longer: the plain call's, three consumers
    (64, False, 2048, (128, 4, 3)),   # (non-causal d 64: short up to 8192 keys)
    (64, False, 16384, (128, 3, 3)),
    (128, True, 4096, (128, 2, 2)),
    (128, True, 8192, (176, 2, 2)),
    (128, False, 2048, (176, 2, 2)),  # (non-causal d 128: short up to 512 keys only)
])
def test_sm90_hooked_forward_tiles_follow_the_key_length(fake, d, causal, n, expect):
    """The softcap alone (no window, dense batch) on Hopper takes the plain call's tiles, by
    key length (SM90_SHORT_KEYS); a window with the hook keeps its own tile at any length."""
    q, k, v = _qkv(1, 64, n, 2, 2, d)
    _api.forward(q, k, v, causal=causal, softcap=5.0)
    ((name, *_),) = fake
    cfg = _plan.sm90_forward_config(d, causal, n, hooked=True)
    assert (cfg.B_c, cfg.stages, cfg.consumers) == expect
    assert cfg == _plan.sm90_forward_config(d, causal, n)
    assert name == _plan.sm90_forward_kernel_name("float16", cfg, causal, hooked=True)
    del fake[:]
    _api.forward(q, k, v, causal=causal, softcap=5.0, window_size=(32, 0))
    ((name, *_),) = fake
    cfg = _plan.sm90_forward_config(d, True, None, local=True, hooked=True)
    assert name == _plan.sm90_forward_kernel_name("float16", cfg, True, True, True)


@pytest.mark.parametrize("window, d, short", [
    ((128, 0), 128, True),     # 128 + 128 rows: within the non-causal limit (512)
    ((256, 100), 128, True),   # 484 keys
    ((300, 100), 128, False),  # 528
    ((1024, 0), 128, False),
    ((128, -1), 128, False),   # the right side unbounded: seqlen_k keys
    ((128, 0), 192, False),    # (no short tile at d 192)
    ((256, 0), 64, True),      # d 64: its own limit, 640 keys (SM90_WINDOW_SHORT_KEYS)
    ((400, 112), 64, True),    # 640
    ((1024, 0), 64, False),    # the plain call's long tile, three consumers at B_c 128
    ((64, -1), 64, True),      # the right side unbounded: 4000 keys, the non-causal limit
])
def test_sm90_window_takes_the_short_tile_by_its_width(fake, window, d, short):
    """A window on Hopper takes the short-key tile where a row block visits few keys (the
    window's width plus 128 rows, against the non-causal limit), whatever seqlen_k is."""
    q, k, v = _qkv(1, 4000, 4000, 2, 2, d)
    _api.forward(q, k, v, window_size=window)
    ((name, *_),) = fake
    upper = window[1] >= 0
    assert _plan.sm90_window_short(d, upper, window[0], max(window[1], 0), 4000) == short
    cfg = _plan.sm90_forward_config(d, upper, 1 if short else None, local=True)
    assert name == _plan.sm90_forward_kernel_name("float16", cfg, upper, True)
    assert (cfg == _plan.sm90_forward_config(d, upper, 1, local=True)) == (short or d == 192)
    # (a window alone over a dense batch: the plain call's tiles)
    assert cfg == _plan.sm90_forward_config(d, upper, 1 if short else None)


def test_registry_lists_every_variant_source():
    assert {v.source for v in _registry.VARIANTS} == \
        {_plan.FORWARD_FILE, _plan.BACKWARD_FILE, _plan.FA1_FILE, _plan.SM90_FORWARD_FILE,
         _plan.SM90_BACKWARD_FILE, _plan.DECODE_FILE}
    for v in _registry.VARIANTS:
        assert v.params in _params.STRUCTS


def test_tma_describes_only_aligned_layouts():
    """TMA needs a 16-byte aligned start and strides that are multiples of 16 bytes (axes of
    length 1 excepted); other layouts take the portable kernel."""
    shape = (2, 100, 4, 64)  # (batch, seq, heads, d), 2-byte elements
    ok = (100 * 4 * 64, 4 * 64, 64)
    assert _tma.usable(256, shape, ok, 2)
    assert not _tma.usable(258, shape, ok, 2)                   # start not 16-byte aligned
    assert not _tma.usable(256, shape, (100 * 4 * 64, 4 * 64, 60), 2)  # head stride 120 B
    assert not _tma.usable(256, shape, (0, 4 * 64, 64), 2)      # a broadcast batch axis
    assert _tma.usable(256, (1, 100, 1, 64), (3, 64, 5), 2)     # length-1 axes: any stride


@pytest.mark.parametrize("window,causal,expect", [
    ((-1, -1), False, (False, False, 0, 0)),    # no window: the plain kernels
    ((-1, -1), True, (True, False, 0, 0)),      # causal
    ((-1, 7), True, (True, False, 0, 0)),       # causal overrides the right side
    ((16, -1), False, (False, True, 16, 0)),    # a left side only
    ((16, 4), False, (True, True, 16, 4)),      # both sides
    ((16, 4), True, (True, True, 16, 0)),       # causal, with a left side
    ((-1, 4), False, (True, True, 333 + 700, 4)),  # a right side only: left past every key
    ((0, 0), False, (True, True, 0, 0)),        # the diagonal alone
])
@pytest.mark.parametrize("family", ["portable", "sm90"])
def test_window_picks_the_mask_and_packs_its_sides(fake, monkeypatch, family, window, causal,
                                                   expect):
    """window_size -> the kernels' Mask<causal, local> and window_left / window_right, in the
    portable forward, the Hopper forward and the backward."""
    monkeypatch.setattr(_tma, "_encode", lambda addr, *a: 0)
    upper, local, left, right = expect
    q, k, v = _qkv(2, 333, 700, 8, 2, 128)
    if family == "portable":
        with _api.portable_kernels():
            _api.forward(q, k, v, causal=causal, window_size=window)
        cfg = _plan.forward_config(128, upper, 227 * 1024, 700, local)
        name = _plan.forward_kernel_name("float16", cfg, upper, local)
    else:
        _api.forward(q, k, v, causal=causal, window_size=window)
        # (a window: the short tile by the window's width, sm90_window_short)
        short = _plan.sm90_window_short(128, upper, left, right, 700) if local else True
        cfg = _plan.sm90_forward_config(128, upper, 700 if short else None)
        name = _plan.sm90_forward_kernel_name("float16", cfg, upper, local)
    ((kname, _, _, _, p),) = fake
    assert kname == name and kname.endswith(", true>>") == local
    assert (p["window_left"], p["window_right"]) == (left, right)
    fake.clear()
    dout = FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((2, 8, 333), np.float32))
    with _family(family):
        _api.backward(dout, q, k, v, dout, lse, causal=causal, window_size=window)
    _, main, fin = fake
    if family == "sm90":  # (the Hopper backward, windows on their own tile)
        names = _plan.sm90_backward_names("float16", _plan.sm90_backward_config(128, local),
                                          upper, local)
        assert (main[0], fin[0]) == (names["main"], names["dq"])
    else:
        bcfg = _plan.backward_config(128, 227 * 1024, True)
        assert main[0] == _plan.backward_kernel_name("float16", bcfg, upper, local=local)
        assert fin[0] == _plan.backward_dq_name("float16", bcfg, upper, local)
    assert (main[4]["window_left"], main[4]["window_right"]) == (left, right)


def _family(family: str):
    """The context a test of both kernel families runs its calls in."""
    return _api.portable_kernels() if family == "portable" else contextlib.nullcontext()


@pytest.mark.parametrize("bad", [(1,), (1, 2, 3), (-2, 0), (0, -5), (True, 0), (1.5, 0), "ab",
                                 None, 4])
def test_bad_window_sizes_are_rejected(fake, bad):
    q, k, v = _qkv(1, 33, 33, 2, 2, 64)
    with pytest.raises(ValueError, match="window_size must be a pair"):
        _api.forward(q, k, v, window_size=bad)
    assert not fake


def test_fa1_takes_no_window(fake):
    q, k, v = _qkv(1, 33, 33, 2, 2, 64)
    with pytest.raises(ValueError, match="window_size needs algorithm='fa2'"):
        _api.forward(q, k, v, window_size=(8, 0), algorithm="fa1")
    _api.forward(q, k, v, causal=True, window_size=(-1, 0), algorithm="fa1")  # (plain causal)


@pytest.mark.parametrize("slopes_shape", [None, (8,), (2, 8)])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("family", ["portable", "sm90"])
def test_score_hook_picks_the_hooked_kernel_and_packs_it(fake, monkeypatch, family, softcap,
                                                         slopes_shape):
    """softcap and alibi_slopes -> the kernels with ScoreHook and its three fields, in both
    forward families and the backward; neither -> today's kernels."""
    monkeypatch.setattr(_tma, "_encode", lambda addr, *a: 0)
    q, k, v = _qkv(2, 333, 700, 8, 2, 128)
    slopes = None if slopes_shape is None else FakeArray(np.full(slopes_shape, 0.5, np.float32))
    hooked = softcap > 0 or slopes is not None
    kw = dict(causal=True, softcap=softcap, alibi_slopes=slopes)
    if family == "portable":
        with _api.portable_kernels():
            _api.forward(q, k, v, **kw)
    else:
        _api.forward(q, k, v, **kw)
    ((name, _, _, _, p),) = fake
    assert name.endswith("cuflash::ScoreHook>") == hooked
    scale = 128 ** -0.5
    assert p["softcap_in"] == pytest.approx(scale / softcap if softcap else 0.0)
    assert p["softcap_out"] == pytest.approx(softcap / scale if softcap else 1.0)
    assert p["alibi_slopes"] == (0 if slopes is None else slopes.data.ptr)
    assert p["alibi_stride_b"] == (8 if slopes_shape == (2, 8) else 0)
    fake.clear()
    dout = FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((2, 8, 333), np.float32))
    with _family(family):
        _api.backward(dout, q, k, v, dout, lse, **kw)
    _, main, _ = fake
    assert main[0].endswith("cuflash::ScoreHook>") == hooked
    if family == "sm90":  # (the Hopper backward, hooked or not)
        cfg = _plan.sm90_backward_config(128, hooked=hooked)
        assert main[0] == _plan.sm90_backward_names("float16", cfg, True,
                                                    hooked=hooked)["main"]
    else:
        bcfg = _plan.backward_config(128, 227 * 1024, True, hooked=hooked)
        assert main[0] == _plan.backward_kernel_name("float16", bcfg, True, hooked=hooked)
    assert (main[4]["softcap_in"], main[4]["alibi_stride_b"]) == \
        (p["softcap_in"], p["alibi_stride_b"])


@pytest.mark.parametrize("kw,match", [
    (dict(softcap=-1.0), "softcap must be"), (dict(softcap=float("nan")), "softcap must be"),
    (dict(softcap=True), "softcap must be"), (dict(softcap="3"), "softcap must be"),
    (dict(softcap=1e39), "softcap must be"),
    (dict(softcap=3e38, softmax_scale=1.0), "must fit in float32"),  # (cap log2 e overflows)
    (dict(softcap=1e38, softmax_scale=0.01), "must fit in float32"),  # (cap / scale overflows)
    (dict(alibi_slopes=np.zeros(2, np.float32)), "numpy.ndarray"),
    (dict(alibi_slopes="s"), "must be a cupy.ndarray"),
    (dict(alibi_slopes=FakeArray(np.zeros(2, np.float64))), "float32 of shape"),
    (dict(alibi_slopes=FakeArray(np.zeros(3, np.float32))), "float32 of shape"),
    (dict(alibi_slopes=FakeArray(np.zeros((2, 1), np.float32))), "float32 of shape"),
    (dict(alibi_slopes=FakeArray(np.zeros((1, 4), np.float32)[:, ::2])), "C-contiguous"),
])
def test_bad_score_hook_arguments_are_rejected(fake, kw, match):
    q, k, v = _qkv(1, 33, 33, 2, 2, 64)
    with pytest.raises((ValueError, TypeError), match=match):
        _api.forward(q, k, v, **kw)
    assert not fake


def test_fa1_takes_no_score_hook(fake):
    q, k, v = _qkv(1, 33, 33, 2, 2, 64)
    with pytest.raises(ValueError, match="need algorithm='fa2'"):
        _api.forward(q, k, v, softcap=5.0, algorithm="fa1")


# ---- variable-length batches (forward_varlen) ------------------------------------------------

def _packed_qkv(lens_q, lens_k, h=4, hk=2, d=64):
    rng = np.random.default_rng(1)
    q = FakeArray(rng.standard_normal((sum(lens_q), h, d)).astype(np.float16))
    k = FakeArray(rng.standard_normal((sum(lens_k), hk, d)).astype(np.float16))
    v = FakeArray(rng.standard_normal((sum(lens_k), hk, d)).astype(np.float16))
    return q, k, v, np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0],
                                                                            np.cumsum(lens_k)])


@pytest.mark.parametrize("family", ["portable", "sm90"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_varlen_packs_the_entries(fake, monkeypatch, family, causal):
    """The packed batch's launch: the grid over the longest entry's row blocks and the
    entries (portable; Hopper: a block per SM at most), seqlen_q / seqlen_k the longest
    lengths, the cu_seqlens copies' addresses, total_q, q and out as (1, total, heads, d) with
    their own strides, L as (heads, total_q)."""
    monkeypatch.setattr(_tma, "_encode", lambda addr, *a: 0)
    lens_q, lens_k = [5, 0, 300, 77], [9, 4, 250, 500]
    q, k, v, cu_q, cu_k = _packed_qkv(lens_q, lens_k)
    if family == "portable":
        with _api.portable_kernels():
            out, lse = _api.forward_varlen(q, k, v, cu_q, list(cu_k), causal=causal)
    else:
        out, lse = _api.forward_varlen(q, k, v, cu_q, list(cu_k), causal=causal)
    ((name, grid, block, smem, p),) = fake
    assert out.shape == q.shape and lse.shape == (4, sum(lens_q))
    assert (p["seqlen_q"], p["seqlen_k"], p["total_q"], p["group"]) == (300, 500, 382, 2)
    assert p["cu_seqlens_q"] != 0 and p["cu_seqlens_k"] != 0
    assert (p["q"], p["k"], p["o"], p["lse"]) == (q.data.ptr, k.data.ptr, out.data.ptr,
                                                  lse.data.ptr)
    assert (p["q_stride_s"], p["q_stride_h"], p["k_stride_s"]) == (4 * 64, 64, 2 * 64)
    if family == "portable":
        cfg = _plan.forward_config(64, causal, 227 * 1024, 500, packed=True)
        assert name == _plan.forward_kernel_name("float16", cfg, causal, packed=True)
        assert name.endswith("cuflash::ScoreScale, cuflash::PackedSeq>")
        assert grid == (-(-300 // cfg.B_r), 4, 4)
    else:
        cfg = _plan.sm90_forward_config(64, causal, 500, packed=True)
        assert name == _plan.sm90_forward_kernel_name("float16", cfg, causal, packed=True)
        assert name.endswith("cuflash::ScoreScale, cuflash::PackedSeq>")
        assert (p["nheads"], p["batch"]) == (4, 4)
        # (a block per SM at most, over nheads x (total_q / B_r + batch) tiles at most; the
        # tiles taken in turn from a counter that starts at zero)
        assert grid[0] == min(4 * (-(-382 // cfg.B_r) + 4), 132)
        assert p["tile_counter"] != 0 and p["per_unit"] == 1


def test_forward_varlen_takes_device_cu_seqlens(fake):
    """int32 device arrays are passed as they are (their own addresses); max_seqlen is then
    needed, unless check_cu_seqlens reads them back."""
    q, k, v, cu_q, cu_k = _packed_qkv([3, 8], [8, 3])
    dq, dk = FakeArray(cu_q.astype(np.int32)), FakeArray(cu_k.astype(np.int32))
    with _api.portable_kernels():
        with pytest.raises(ValueError, match="max_seqlen_q is needed"):
            _api.forward_varlen(q, k, v, dq, dk)
        assert not fake
        _api.forward_varlen(q, k, v, dq, dk, 8, 8)
        _api.forward_varlen(q, k, v, dq, dk, check_cu_seqlens=True)
    (_, _, _, _, p), (_, _, _, _, p2) = fake
    assert (p["cu_seqlens_q"], p["cu_seqlens_k"]) == (dq.data.ptr, dk.data.ptr)
    assert (p2["seqlen_q"], p2["seqlen_k"]) == (8, 8)


@pytest.mark.parametrize("cu_q,cu_k,kw,err", [
    ([1, 3, 11], [0, 8, 11], {}, "cu_seqlens_q must start at 0"),
    ([0, 9, 8, 11], [0, 1, 2, 11], {}, "never decrease"),
    ([0, 3, 10], [0, 8, 11], {}, "end at 11"),
    ([0, 11], [0, 8, 11], {}, "same length"),
    ([0.0, 11.0], [0, 11], {}, "integer sequence"),
    ([0, 3, 11], [0, 8, 11], {"max_seqlen_q": 7}, "less than the longest"),
    ([0, 3, 11], [0, 8, 11], {"max_seqlen_k": -1}, "int >= 0"),
])
def test_forward_varlen_refuses_bad_cu_seqlens(fake, cu_q, cu_k, kw, err):
    q, k, v, _, _ = _packed_qkv([3, 8], [8, 3])
    with pytest.raises(ValueError, match=err):
        _api.forward_varlen(q, k, v, cu_q, cu_k, **kw)
    assert not fake


def test_forward_varlen_refuses_bad_arrays(fake):
    q, k, v, cu_q, cu_k = _packed_qkv([3, 8], [8, 3])
    with pytest.raises(ValueError, match="3-D"):
        _api.forward_varlen(q[None], k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="1-D int32"):
        _api.forward_varlen(q, k, v, FakeArray(cu_q.astype(np.int64)), cu_k, 8, 8)
    with pytest.raises(TypeError, match="sequence of ints"):
        _api.forward_varlen(q, k, v, 11, cu_k)
    with pytest.raises(ValueError, match=r"alibi_slopes must be float32 of shape \(4,\) or "
                                         r"\(2, 4\)"):
        _api.forward_varlen(q, k, v, cu_q, cu_k, alibi_slopes=FakeArray(
            np.ones((3, 4), np.float32)))
    assert not fake


def test_precompile_builds_the_feature_and_packed_kernels_asked_for():
    """precompile(windows=..., varlen=...): the feature keyword sets per variant (FA1 takes no
    packed batch)."""
    fwd, bwd, fa1 = _registry.FA2_FORWARD, _registry.FA2_BACKWARD, _registry.FA1_FORWARD
    assert _api._precompile_features(fwd, False, False) == [{}]
    assert _api._precompile_features(fwd, False, True) == [{}, {"packed": True}]
    both = _api._precompile_features(fwd, True, True)
    assert len(both) == 8 and {"local": True, "hooked": True, "packed": True} in both
    assert _api._precompile_features(bwd, True, True) == both
    assert _api._precompile_features(fa1, True, True) == [{}]


def test_backward_varlen_runs_the_packed_kernels(fake):
    """backward_varlen: one launch set of the PackedSeq backward kernels over the whole batch:
    the grid over the longest entry's column blocks, the kv heads (one part: no float32
    slices) and the entries; seqlen_q / seqlen_k the longest lengths, the cu_seqlens copies'
    addresses and total_q; D laid out as L, (heads, total_q)."""
    lens_q, lens_k = [5, 0, 300, 7], [9, 4, 250, 0]
    q, k, v, cu_q, cu_k = _packed_qkv(lens_q, lens_k)
    dout = FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((4, q.shape[0]), np.float32))
    with _api.portable_kernels():
        dq, dk, dv = _api.backward_varlen(dout, q, k, v, dout, lse, cu_q, cu_k, causal=True)
    (pre, _, _, _, pp), (main, grid, _, _, p), (fin, _, _, _, _) = fake
    cfg = _plan.backward_config(64, 227 * 1024, True, packed=True)  # (bwd_packed's tile)
    assert pre == _plan.backward_preprocess_name("float16", packed=True)
    assert main == _plan.backward_kernel_name("float16", cfg, True, packed=True)
    assert fin == _plan.backward_dq_name("float16", cfg, True, packed=True)
    assert main.endswith("cuflash::ScoreScale, cuflash::PackedSeq>")
    assert grid == (-(-250 // cfg.B_c), 2, 4)
    assert (p["seqlen_q"], p["seqlen_k"], p["total_q"], p["head_parts"]) == (300, 250, 312, 1)
    assert p["cu_seqlens_q"] != 0 and p["cu_seqlens_k"] != 0 and p["deterministic"] == 0
    assert (p["q"], p["k"], p["dq"]) == (q.data.ptr, k.data.ptr, dq.data.ptr)
    assert pp["dsum"] == p["dsum"]
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    # the compact dQ workspace: with bulk dQ, row blocks for the entries' own rows
    assert cfg.dq_bulk and p["ws_blocks"] == -(-312 // cfg.B_r) + 4 and p["row_block_offsets"]


@pytest.mark.parametrize("causal", [False, True])
def test_sm90_backward_varlen_runs_the_packed_hopper_kernels(fake, causal):
    """backward_varlen on an sm_90 GPU: the Hopper backward's PackedSeq kernels over the whole
    batch (grid: the longest entry's column blocks, the kv heads, the entries), with the
    packed fields, and D, L log2 e and the dQ sums in the entries' own row blocks of B_r rows
    (ws_blocks, row_block_offsets); deterministic, entry by entry as before."""
    lens_q, lens_k = [5, 0, 300, 7], [9, 4, 250, 0]
    q, k, v, cu_q, cu_k = _packed_qkv(lens_q, lens_k)
    dout = FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((4, q.shape[0]), np.float32))
    dq, dk, dv = _api.backward_varlen(dout, q, k, v, dout, lse, cu_q, cu_k, causal=causal)
    (pre, pgrid, _, _, pp), (main, grid, _, smem, p), (fin, _, _, _, _) = fake
    cfg = _plan.sm90_backward_config(64)
    names = _plan.sm90_backward_names("float16", cfg, causal, packed=True)
    assert (pre, main, fin) == (names["pre"], names["main"], names["dq"])
    assert main.endswith("false, cuflash::ScoreScale, cuflash::PackedSeq>")
    assert grid == (-(-250 // cfg.B_c), 2, 4) and smem == cfg.smem_bytes
    assert pgrid[0] * (128 // pp["lanes"]) >= -(-300 // 64) * 64  # (the longest, padded)
    assert (p["seqlen_q"], p["seqlen_k"], p["total_q"], p["deterministic"]) == (300, 250, 312, 0)
    assert p["cu_seqlens_q"] != 0 and p["cu_seqlens_k"] != 0 and p["row_block_offsets"] != 0
    assert p["ws_blocks"] == -(-312 // cfg.B_r) + 4
    assert pp == p and (p["q"], p["dq"], p["dk"]) == (q.data.ptr, dq.data.ptr, dk.data.ptr)
    fake.clear()
    _api.backward_varlen(dout, q, k, v, dout, lse, cu_q, cu_k, causal=causal,
                         deterministic=True)
    assert all("fa2_backward_sm90<" not in name or "PackedSeq" not in name
               for name, *_ in fake)


@pytest.mark.parametrize("d", [64, 128])
def test_sm90_backward_varlen_with_the_hook(fake, d):
    """The softcap over a variable-length batch: the Hopper backward's hooked PackedSeq kernel
    at d 64; at d 128 the portable backward (the packed hooked d 128 kernels spill:
    _plan.sm90_backward_buckets), while d 128's dense hooked calls take the Hopper one."""
    q, k, v, cu_q, cu_k = _packed_qkv([5, 0, 300, 7], [9, 4, 250, 0], d=d)
    dout = FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((4, q.shape[0]), np.float32))
    _api.backward_varlen(dout, q, k, v, dout, lse, cu_q, cu_k, causal=True, softcap=20.0)
    mains = [name for name, *_ in fake if name.startswith("cuflash::fa2_backward")
             and "preprocess" not in name and "dq" not in name]
    if d == 64:
        cfg = _plan.sm90_backward_config(64, hooked=True, packed=True)
        assert mains == [_plan.sm90_backward_names("float16", cfg, True, hooked=True,
                                                   packed=True)["main"]]
        assert mains[0].endswith("cuflash::ScoreHook, cuflash::PackedSeq>")
    else:
        assert _plan.sm90_backward_config(128, hooked=True, packed=True) is None
        assert _plan.sm90_backward_config(128, hooked=True) is not None
        assert len(mains) == 1 and mains[0].startswith("cuflash::fa2_backward<"), mains


@pytest.mark.parametrize("bulk", [1, 0])
def test_packed_dq_workspace_is_compact(fake, bulk):
    """backward_varlen's float32 dQ sums cover the entries' own rows: (heads, total_q, HD) with
    dQ atomics; with bulk dQ, whole row blocks, entry b's from the prefix sum of
    ceil(len / B_r) (here B_r 64: 1, 0, 5, 1 blocks), within ws_blocks."""
    cp = _api._cupy()
    cu_q = FakeArray(np.array([0, 5, 5, 305, 312], np.int32))
    packed = _api._Packed(4, 300, 250, cu_q, cu_q, 312)
    cfg = _plan.BackwardConfig(64, 64, 128, 8, 2, 4, 2, 1, bulk)
    ws, fields = _api._packed_dq_workspace(cp, packed, cfg, 6, 312)
    if not bulk:
        assert ws.shape == (6, 312, 64) and fields == {}
        return
    assert fields["ws_blocks"] == 5 + 4 and ws.shape == (6, 9 * 64, 64)
    assert packed.workspace.a.tolist() == [0, 1, 1, 6, 7]
    assert fields["row_block_offsets"] == packed.workspace.data.ptr
    assert not ws.a.any()  # (zeroed: the kernels add into it)


def test_backward_varlen_deterministic_runs_each_sequence_on_its_rows(fake):
    """deterministic=True: one dense deterministic backward per sequence with queries and
    keys, on views of the packed arrays at each sequence's first row (no launch for the empty
    ones), L gathered per sequence; dq, dk, dv zeroed first (keys no query sees keep zero
    gradients)."""
    lens_q, lens_k = [5, 0, 300, 7], [9, 4, 250, 0]
    q, k, v, cu_q, cu_k = _packed_qkv(lens_q, lens_k)
    dout = FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((4, q.shape[0]), np.float32))
    with _api.portable_kernels():
        dq, dk, dv = _api.backward_varlen(dout, q, k, v, dout, lse, cu_q, cu_k, causal=True,
                                          deterministic=True)
    mains = [p for name, _, _, _, p in fake if name.startswith("cuflash::fa2_backward<")]
    assert [(p["seqlen_q"], p["seqlen_k"]) for p in mains] == [(5, 9), (300, 250)]
    assert all(p["deterministic"] == 1 for p in mains)
    row = 4 * 64 * 2  # bytes per packed query row (4 heads, d 64, fp16)
    assert [p["q"] - q.data.ptr for p in mains] == [0, 5 * row]
    assert [p["k"] - k.data.ptr for p in mains] == [0, 13 * (2 * 64 * 2)]
    assert [p["dq"] - dq.data.ptr for p in mains] == [0, 5 * row]
    assert dq.shape == q.shape and dk.shape == k.shape and not dk.a.any()


def test_backward_varlen_refuses_a_dense_lse(fake):
    q, k, v, cu_q, cu_k = _packed_qkv([3, 8], [8, 3])
    with pytest.raises(ValueError, match=r"lse must be float32 of shape \(heads, total_q\)"):
        _api.backward_varlen(q, q, k, v, q, FakeArray(np.zeros((1, 4, 11), np.float32)), cu_q,
                             cu_k)
    assert not fake


@pytest.mark.parametrize("causal", [False, True])
def test_odd_head_dim_takes_the_odd_d_kernels(fake, causal):
    """d = 59: the portable OddD kernels, also on Hopper (TMA moves 16-byte rows), with the
    window's sides past every key (causal: right = 0) and the hook off; inputs and outputs
    as they are, no aligned copies."""
    q, k, v = _qkv(2, 100, 300, 4, 2, 59)
    out, _ = _api.forward(q, k, v, causal=causal)
    ((name, _, _, _, p),) = fake
    cfg = _plan.forward_config(64, causal, 227 * 1024, None, odd_d=True)
    assert name == _plan.forward_kernel_name("float16", cfg, causal, True, True)
    assert name.startswith("cuflash::fa2_forward<cuflash::fp16, cuflash::OddD<")
    assert (p["window_left"], p["window_right"]) == (400, 0 if causal else 400)
    assert (p["d"], p["softcap_in"], p["alibi_slopes"], p["q"]) == (59, 0.0, 0, q.data.ptr)
    fake.clear()
    dout = FakeArray(np.ones(q.shape, np.float16))
    lse = FakeArray(np.zeros((2, 4, 100), np.float32))
    _api.backward(dout, q, k, v, out, lse, causal=causal)
    _, main, _ = fake
    bcfg = _plan.backward_config(64, 227 * 1024, True, odd_d=True)
    assert main[0] == _plan.backward_kernel_name("float16", bcfg, causal, local=True,
                                                 hooked=True)
    assert (main[4]["d"], main[4]["window_left"], main[4]["dout"]) == (59, 400, dout.data.ptr)
    with pytest.raises(ValueError, match="algorithm='fa1' needs a head dim that is a multiple"):
        _api.forward(q, k, v, algorithm="fa1")


@pytest.mark.parametrize("sq,sk,h,hk,d,batch,folds", [
    (17, 9000, 16, 16, 32, 2, 3), (300, 5000, 8, 1, 64, 1, 4), (1000, 1000, 4, 4, 128, 1, 8)])
def test_backward_scratch_size_holds_for_folded_batches(fake, monkeypatch, sq, sk, h, hk, d,
                                                        batch, folds):
    """cuflash.jax sizes the scratch for one vmap slice and XLA hands the callback `folds`
    of them for the folded batch: enough on sm_80 too, where the deterministic mode's dQ
    slices and the GQA parts are chosen per batch size (found by review: 3 slices of one
    batch became 9 of the folded one)."""
    cp = _fake_cupy(sms=108, smem=163 * 1024, cc=80)
    monkeypatch.setattr(_api, "_cupy", lambda: cp)
    for deterministic in (False, True):
        one = _api._backward_scratch_bytes((batch, sq, h, d), (batch, sk, hk, d), False,
                                           (-1, -1), 0.0, None, deterministic)
        q, k, v = _qkv(batch * folds, sq, sk, h, hk, d)
        dout, out = (FakeArray(np.ones(q.shape, np.float16)) for _ in range(2))
        lse = FakeArray(np.zeros((batch * folds, h, sq), np.float32))
        _api._backward(dout, q, k, v, out, lse, False, None, deterministic, None, None, None,
                       None, scratch=FakeArray(np.zeros(one * folds, np.uint8)))


def test_fast_div_matches_integer_division():
    # FastDiv (kernels/common.cuh): n / d = (umulhi(n, mul) + n) >> shift in 32-bit unsigned
    # arithmetic, for every 0 <= n < 2^31, with the host's (mul, shift) (_registry.fast_div)
    rng = np.random.default_rng(0)
    divisors = list(range(1, 2049)) + [2 ** k + e for k in range(11, 31) for e in (-1, 0, 1)]
    divisors += [int(x) for x in rng.integers(1, 2 ** 31, 500)]
    for d in divisors:
        mul, shift = _registry.fast_div(d)
        assert 0 < mul < 2 ** 32 and 0 <= shift <= 31
        ns = [0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 2 ** 31 - 1, 2 ** 31 - 2]
        ns += [int(x) for x in rng.integers(0, 2 ** 31, 40)]
        ns += [int(x) for x in rng.integers(0, 4 * d + 4, 20)]
        for n in ns:
            if not 0 <= n < 2 ** 31:
                continue
            hi_plus_n = ((n * mul) >> 32) + n
            assert hi_plus_n < 2 ** 32  # (no carry out of the 32-bit add)
            assert hi_plus_n >> shift == n // d, (n, d)
    with pytest.raises(ValueError):
        _registry.fast_div(0)


def test_sm90_forward_walk_divides_by_heads_and_a_pairs_units():
    cfg = _plan.sm90_forward_config(64, True)
    for seqlen_q, heads, per_unit in ((1, 1, 1), (512, 32, 2), (16384, 16, 2), (333, 7, 1),
                                      (0, 3, 1)):
        walk = _registry.sm90_forward_walk(cfg, seqlen_q, heads, per_unit)
        T_r = (seqlen_q + cfg.B_r - 1) // cfg.B_r
        unit_rows = max(1, (T_r + per_unit - 1) // per_unit)
        assert (walk["heads_mul"], walk["heads_shift"]) == _registry.fast_div(heads)
        assert ((walk["unit_rows_mul"], walk["unit_rows_shift"])
                == _registry.fast_div(unit_rows))
        # the fields pack (u32 multipliers up to 2^32 - 1)
        buf = bytearray(_params.SM90_FWD.size)
        fields = {f.name: (0 if f.kind != "strides" else (0, 0, 0))
                  for f in _params.SM90_FWD.fields if f.default is None}
        fields.update({f.name: b"\0" * 128 for f in _params.SM90_FWD.fields if f.kind == "tmap"})
        _params.SM90_FWD.pack_into(buf, **fields, **walk)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,sq,h", [(2, 128 * 70, 2), (1, 333, 7), (3, 4096, 12)])
def test_dense_sm90_forward_launches_carry_the_walk_divisors(fake, causal, b, sq, h):
    # the fields default to a division by 1: a dense launch without them would walk the
    # wrong tiles with no error (fa2_forward_sm90.cu, "the tiles")
    q, k, v = _qkv(b, sq, 6001, h, 1, 128, BF16)
    for _ in range(3):  # (the first call, then the remembered launches)
        _api.forward(q, k, v, causal=causal)
    assert fake
    for name, _, _, _, p in fake:
        assert "fa2_forward_sm90" in name
        (cfg,) = [c for c in _plan.sm90_forward_configs(128, causal) if c.tile_type in name]
        T_r = (sq + cfg.B_r - 1) // cfg.B_r
        unit_rows = (T_r + p["per_unit"] - 1) // p["per_unit"]
        assert (p["heads_mul"], p["heads_shift"]) == _registry.fast_div(h)
        assert (p["unit_rows_mul"], p["unit_rows_shift"]) == _registry.fast_div(unit_rows)
