"""CPU: ring attention's layout, schedule and loop (cuflash.distributed), and its watchdog.

The ring loop is the one the GPUs run (_ring_forward / _ring_backward), here with P ranks as
threads passing NumPy arrays through queues, and each block computed by the float64 reference
rounded as the kernels round (out and the gradients to the inputs' dtype, lse to float32),
so the accuracy rule of shared/guides/accuracy.md is checked against the full sequence's
float64 attention before any GPU runs it. The 2-GPU tests (NCCL) are in
test_distributed_gpu.py."""

import itertools
import queue
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from cuflash import _api, distributed, reference
from cuflash.distributed import ring_blocks, ring_steps, zigzag_shard, zigzag_unshard

BF16 = ml_dtypes.bfloat16


class ThreadRing:
    """The ring transport between threads, as lazy as NCCL on its own stream: exchange posts
    copies of `sends` to rank + 1's queue and poisons `recvs` (NaN): they hold rank - 1's
    arrays only after wait(handle), which also checks that the sent arrays were left alone
    meanwhile. A loop that reads a received buffer before waiting, or writes a buffer it is
    sending, fails the accuracy test. Every rank calls exchange in the same order."""

    def __init__(self, rank, world, boxes):
        self.rank, self.world, self.boxes = rank, world, boxes

    def exchange(self, sends, recvs):
        sent = [np.array(x, copy=True) for x in sends]
        self.boxes[(self.rank + 1) % self.world].put(sent)
        for x in recvs:
            x[...] = np.nan
        return (recvs, sends, sent)

    def wait(self, handle):
        recvs, sends, sent = handle
        for live, copy in zip(sends, sent):  # (the transfer may still be reading them)
            assert np.array_equal(live, copy, equal_nan=True), "a sent buffer changed"
        for dst, src in zip(recvs, self.boxes[self.rank].get(timeout=60)):
            dst[...] = src


def run_ranks(world, fn):
    """fn(ring) on `world` threads; the results in rank order (an exception is re-raised)."""
    boxes = [queue.Queue() for _ in range(world)]
    results, errors = [None] * world, []

    def one(r):
        try:
            results[r] = fn(ThreadRing(r, world, boxes))
        except BaseException as exc:  # noqa: BLE001  (re-raised below)
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results


def _blocks(scale, softcap, alibi_slopes=None):
    """The block kernels as the GPU runs them, in float64 then rounded like cuflash's: each
    block's mask and ALiBi counted from its shifted diagonal (the RingStep's)."""
    def attend(q, k, v, step):
        O, L = reference.attention_naive(q, k, v, step.causal, scale, softcap=softcap,
                                         window_size=step.window_size,
                                         alibi_slopes=alibi_slopes, diag_shift=step.diag_shift)
        return O.astype(q.dtype), L.astype(np.float32)

    def attend_backward(dout, q, k, v, out, lse, step):
        grads = reference.attention_backward_fa2_tiled(
            dout, q, k, v, out, lse, step.causal, scale, softcap=softcap,
            window_size=step.window_size, alibi_slopes=alibi_slopes,
            diag_shift=step.diag_shift)
        return tuple(g.astype(x.dtype) for g, x in zip(grads, (q, k, v)))
    return attend, attend_backward


def test_zigzag_shard_and_unshard_are_inverse():
    x = np.arange(2 * 24 * 3).reshape(2, 24, 3)
    for world in (1, 2, 3, 4, 6):
        parts = [zigzag_shard(x, r, world) for r in range(world)]
        c = 24 // (2 * world)
        assert parts[0].shape == (2, 2 * c, 3)
        np.testing.assert_array_equal(parts[-1][:, :c], x[:, (world - 1) * c:world * c])
        np.testing.assert_array_equal(parts[-1][:, c:], x[:, world * c:(world + 1) * c])
        np.testing.assert_array_equal(zigzag_unshard(parts), x)
    with pytest.raises(ValueError, match="multiple of 2 x world"):
        zigzag_shard(x, 0, 5)
    with pytest.raises(ValueError, match="rank must be in"):
        zigzag_shard(x, 2, 2)


def _global_positions(rank, world, n_local, layout):
    if layout == "contiguous":
        return np.arange(rank * n_local, (rank + 1) * n_local)
    c = n_local // 2
    return np.concatenate([np.arange(rank * c, (rank + 1) * c),
                           np.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("causal,layout", [(False, "zigzag"), (True, "zigzag"),
                                           (True, "contiguous")])
def test_ring_steps_attend_every_visible_pair_exactly_once(world, causal, layout):
    """Over all ranks and steps, the blocks (with their masks) cover each (query, key) pair
    of the full sequence that the mask lets through exactly once, and no other; zigzag gives
    every rank the same work at each step (no rank waits for another in the ring)."""
    n_local = 6
    seen = np.zeros((world * n_local, world * n_local), dtype=int)
    work = np.zeros((world, world), dtype=int)
    for rank in range(world):
        mine = _global_positions(rank, world, n_local, layout)
        for s, step in enumerate(ring_steps(rank, world, n_local, causal, layout)):
            src = (rank - s) % world
            if step is None:
                continue
            assert step.src == src
            qpos = mine[step.q_rows]
            kpos = _global_positions(src, world, n_local, layout)[step.kv_rows]
            visible = np.ones((qpos.size, kpos.size), dtype=bool)
            if step.causal:  # (a square block on the same positions: the plain causal mask)
                assert qpos.size == kpos.size
                visible = np.tril(visible)
            if causal:  # the block must never need the mask it does not apply
                assert (kpos[None, :] <= qpos[:, None])[visible].all()
            seen[np.ix_(qpos, kpos)] += visible
            work[rank, s] = visible.sum()
    expected = np.tril(np.ones_like(seen)) if causal else np.ones_like(seen)
    np.testing.assert_array_equal(seen, expected)
    if layout == "zigzag":
        assert (work == work[:1]).all(), work  # (each step: the same on every rank)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal,window,alibi", [
    (False, (3, 2), False), (True, (5, -1), False), (False, (-1, -1), True),
    (True, (-1, -1), True), (False, (0, 7), True), (True, (2, 0), True), (False, (-1, 4), False)])
def test_ring_blocks_place_each_block_where_its_positions_are(world, layout, causal, window,
                                                             alibi):
    """With a window or ALiBi, each block's mask counted from its shifted diagonal is the
    whole sequence's mask at the block's positions, and its ALiBi distances are the global
    |p - p'|; over all ranks and steps every visible pair is attended exactly once."""
    n_local = 6
    n = world * n_local
    expected = reference.Mask(n, n, causal, *window).visible()
    seen = np.zeros((n, n), dtype=int)
    for rank in range(world):
        mine = _global_positions(rank, world, n_local, layout)
        steps = ring_blocks(rank, world, n_local, causal, layout, window, alibi)
        assert len(steps) == world
        for s, blocks in enumerate(steps):
            src = (rank - s) % world
            theirs = _global_positions(src, world, n_local, layout)
            for step in blocks:
                assert step.src == src
                qpos, kpos = mine[step.q_rows], theirs[step.kv_rows]
                assert (np.diff(qpos) == 1).all() and (np.diff(kpos) == 1).all()
                local = reference.Mask(qpos.size, kpos.size, step.causal, *step.window_size,
                                       diag_shift=step.diag_shift).visible()
                np.testing.assert_array_equal(local, expected[np.ix_(qpos, kpos)])
                assert local.any()
                seen[np.ix_(qpos, kpos)] += local
                if alibi:
                    S = reference.Score(1.0, 0.0, np.ones(1), step.diag_shift).apply(
                        np, np.zeros((1, 1, qpos.size, kpos.size)), np.arange(qpos.size),
                        np.arange(kpos.size), qpos.size, kpos.size)
                    np.testing.assert_array_equal(-S[0, 0], np.abs(qpos[:, None] - kpos))
    np.testing.assert_array_equal(seen, expected)


class _KernelMask:
    """kernels/mask.cuh's Mask<upper, local> with the fields _api._window gives (sides of
    any sign, no diagonal shift), in reference.Mask's interface, for the block ranges."""

    def __init__(self, seqlen_q, seqlen_k, upper, local, left, right):
        self.seqlen_q, self.seqlen_k, self.upper, self.LOCAL = seqlen_q, seqlen_k, upper, local
        self.left, self.right = left, right

    def keys(self, row):
        diag = np.asarray(row) + self.seqlen_k - self.seqlen_q
        hi = np.full(np.shape(row), self.seqlen_k - 1)
        if self.upper:
            hi = np.minimum(hi, diag + (self.right if self.LOCAL else 0))
        lo = np.maximum(0, diag - self.left) if self.LOCAL else np.zeros(np.shape(row), int)
        return (lo, hi) if np.ndim(row) else (int(lo), int(hi))

    def first_row(self, col_lo):
        if not self.upper:
            return 0
        return max(0, col_lo - (self.seqlen_k - self.seqlen_q)
                   - (self.right if self.LOCAL else 0))

    def last_row(self, col_hi):
        if not self.LOCAL:
            return self.seqlen_q - 1
        return min(self.seqlen_q - 1, col_hi - (self.seqlen_k - self.seqlen_q) + self.left)

    def visible(self):
        lo, hi = self.keys(np.arange(self.seqlen_q))
        cols = np.arange(self.seqlen_k)[None, :]
        return (cols >= lo[:, None]) & (cols <= hi[:, None])


@pytest.mark.parametrize("causal", [False, True])
def test_the_host_folds_a_diagonal_shift_into_the_kernels_window(causal):
    """_api._window(..., diag_shift): the kernels' mask with the sides it gives (which may be
    negative) is the reference's mask counted from the shifted diagonal, and the kernels'
    block ranges (block_range.cuh, as reference.py mirrors them) skip no visible key and
    leave no hidden key unmasked."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        sq, sk = (int(x) for x in rng.integers(1, 40, 2))
        shift = int(rng.integers(-50, 51)) if rng.random() < 0.9 else 0
        window = tuple(int(w) for w in rng.integers(-1, 12, 2))
        upper, local, left, right = _api._window(causal, window, sq, sk, shift)
        kernel = _KernelMask(sq, sk, upper, local, left, right)
        expected = reference.Mask(sq, sk, causal, *window, diag_shift=shift).visible()
        np.testing.assert_array_equal(kernel.visible(), expected, err_msg=str(
            (sq, sk, causal, window, shift)))
        B_r, B_c = 8, 8
        for i in range(-(-sq // B_r)):
            cb = reference.column_blocks(kernel, i, B_r, B_c)
            rows = expected[i * B_r:(i + 1) * B_r]
            for j in range(-(-sk // B_c)):
                block = rows[:, j * B_c:(j + 1) * B_c]
                if not cb.begin <= j < cb.end:
                    assert not block.any(), (sq, sk, causal, window, shift, i, j)
                elif cb.unmasked_begin <= j < cb.masked_begin:
                    assert block.all() and block.shape[1] == B_c
        for j in range(-(-sk // B_c)):
            begin, end = reference.row_blocks(kernel, j, B_r, B_c)
            for i in range(-(-sq // B_r)):
                if not begin <= i < end:
                    assert not expected[i * B_r:(i + 1) * B_r, j * B_c:(j + 1) * B_c].any()


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("world,causal,layout", [
    (1, True, "zigzag"), (2, False, "zigzag"), (2, True, "zigzag"), (3, True, "zigzag"),
    (4, True, "zigzag"), (3, True, "contiguous"), (4, False, "contiguous")])
@pytest.mark.parametrize("heads_k,c,softcap", [(4, 7, 0.0), (1, 5, 0.0), (2, 8, 6.0)])
def test_ring_matches_full_attention_by_the_accuracy_rule(dtype, world, causal, layout,
                                                          heads_k, c, softcap):
    """out, lse and dq, dk, dv of the ring, gathered back, against float64 attention on the
    whole sequence: at most 2x (3x for the gradients) the error of naive attention in the
    same dtype. GQA/MQA, odd chunk lengths, softcap."""
    _ring_against_full_attention(dtype, world, causal, layout, heads_k, c, softcap)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("world,causal,layout,window,alibi", [
    (2, True, "zigzag", (5, -1), False), (3, False, "zigzag", (4, 3), True),
    (2, True, "zigzag", (-1, -1), True), (4, True, "zigzag", (9, 0), True),
    (3, True, "contiguous", (6, 0), True), (2, False, "contiguous", (-1, 2), False),
    (3, False, "zigzag", (-1, -1), True)])
def test_ring_with_windows_and_alibi_matches_full_attention(dtype, world, causal, layout,
                                                            window, alibi):
    """Sliding windows and ALiBi over the whole sequence's positions: the ring's blocks, each
    placed by its diagonal shift, against float64 attention on the whole sequence (the
    accuracy rule), with GQA, an odd chunk length and per-(batch, head) slopes."""
    slopes = (0.3 * np.random.default_rng(5).random((2, 4))).astype(np.float32) \
        if alibi else None
    _ring_against_full_attention(dtype, world, causal, layout, 2, 5, 0.0, window, slopes)


def _ring_against_full_attention(dtype, world, causal, layout, heads_k, c, softcap,
                                 window=(-1, -1), alibi_slopes=None):
    batch, heads, d = 2, 4, 16
    n_local = 2 * c if layout == "zigzag" else c
    n = world * n_local
    rng = np.random.default_rng(world * 100 + c)
    q, dout = (rng.standard_normal((batch, n, heads, d)).astype(dtype) for _ in range(2))
    k, v = (rng.standard_normal((batch, n, heads_k, d)).astype(dtype) for _ in range(2))
    scale = 1 / np.sqrt(d)
    attend, attend_backward = _blocks(scale, softcap, alibi_slopes)
    alibi = alibi_slopes is not None

    def shard(x, r):
        return zigzag_shard(x, r, world) if layout == "zigzag" else \
            x[:, r * n_local:(r + 1) * n_local].copy()

    def unshard(parts, axis=1):
        return zigzag_unshard(parts, axis) if layout == "zigzag" else \
            np.concatenate(parts, axis=axis)

    def rank_fn(ring):
        Q, K, V, dO = (shard(x, ring.rank) for x in (q, k, v, dout))
        out, lse = distributed._ring_forward(ring, attend, Q, K, V, causal, layout, window,
                                             alibi)
        grads = distributed._ring_backward(ring, attend_backward, dO, Q, K, V, out, lse,
                                           causal, layout, window, alibi)
        return out, lse, grads

    results = run_ranks(world, rank_fn)
    out = unshard([r[0] for r in results])
    lse = unshard([r[1] for r in results], axis=2)
    grads = [unshard([r[2][i] for r in results]) for i in range(3)]
    assert out.dtype == dtype and lse.dtype == np.float32 and grads[1].shape == k.shape

    def err(a, ref):
        return float(np.abs(np.asarray(a, np.float64) - ref).max())

    kw = dict(causal=causal, softmax_scale=scale, softcap=softcap, window_size=window,
              alibi_slopes=alibi_slopes)
    O, L = reference.attention_naive(q, k, v, **kw)
    naive = reference.attention_naive_same_dtype(q, k, v, **kw)
    assert err(out, O) <= 2 * err(naive, O) + 1e-5
    assert err(lse, L) <= 1e-3
    ref = reference.attention_backward_naive(dout, q, k, v, **kw)
    naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, **kw)
    for name, g, r, nv in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert err(g, r) <= 3 * err(nv, r) + 1e-5, f"{name}: {err(g, r)} vs {err(nv, r)}"


def test_merge_partial_is_exact_and_keeps_empty_and_nan_rows():
    rng = np.random.default_rng(0)
    O1, O2 = rng.standard_normal((2, 1, 4, 2, 3))
    L1, L2 = rng.standard_normal((2, 1, 2, 4))
    L2[0, 0, 1] = -np.inf          # a row the second part saw no key of
    L1[0, 1, 2] = L2[0, 1, 2] = -np.inf  # a row no part saw a key of
    O1[0, 2, 1] = O2[0, 2, 1] = 0
    L1[0, 0, 3] = np.nan          # NaN in: NaN out, never "no key"
    out = np.zeros((1, 4, 2, 3), np.float32)
    lse = np.full((1, 2, 4), -np.inf, np.float32)
    for O_s, L_s in ((O1, L1), (O2, L2)):
        distributed.merge_partial(np, out, lse, slice(0, 4), O_s, L_s)
    with np.errstate(invalid="ignore"):
        L = np.logaddexp(L1, L2)
        w1, w2 = np.exp(L1 - L), np.exp(L2 - L)
    expect = O1 * w1.transpose(0, 2, 1)[..., None] + O2 * w2.transpose(0, 2, 1)[..., None]
    fin = np.isfinite(L)
    np.testing.assert_allclose(lse[fin], L[fin], rtol=1e-6, atol=1e-6)
    assert np.isneginf(lse[0, 1, 2]) and (out[0, 2, 1] == 0).all()
    assert np.isnan(lse[0, 0, 3]) and np.isnan(out[0, 3, 0]).all()
    ok = np.broadcast_to(fin.transpose(0, 2, 1)[..., None], out.shape)
    np.testing.assert_allclose(out[ok], expect[ok], rtol=1e-5, atol=1e-6)


class _Never:
    done = False


class _Done:
    done = True


def test_watchdog_gives_up_on_a_transfer_that_never_finishes():
    aborted = []
    dog = distributed._Watchdog(0.2, lambda: aborted.append(1), lambda: None, "test")
    dog.track(_Done(), _Done(), "exchange")
    dog.track(_Done(), _Never(), "exchange")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="within 0.2 s .a lost or stalled peer"):
        dog.wait_host(_Never())
    assert time.monotonic() - t0 < 5 and aborted == [1]
    with pytest.raises(RuntimeError, match="communicator was aborted"):
        dog.check()


def test_watchdog_counts_only_from_when_a_transfer_can_run():
    """A transfer queued behind long compute (its ready event not done) or behind an earlier
    transfer is not late, however long it waits; its clock starts once it can run."""
    aborted = []
    dog = distributed._Watchdog(0.2, lambda: aborted.append(1), lambda: None, "test")
    first, compute = _Never(), _Never()
    dog.track(compute, first, "exchange")          # behind compute still running
    dog.track(_Done(), _Never(), "exchange")       # behind the first transfer
    time.sleep(0.6)
    dog.check()
    assert aborted == []
    compute.done = True                            # the first can run now, and never ends
    with pytest.raises(RuntimeError, match="did not finish an NCCL exchange"):
        dog.wait_host(_Never())
    assert aborted == [1]


def test_watchdog_gives_up_on_a_blocked_nccl_call():
    aborted = []
    dog = distributed._Watchdog(0.2, lambda: aborted.append(1), lambda: None, "test")
    dog.calling("exchange")
    with pytest.raises(RuntimeError, match="blocked in an NCCL exchange call"):
        dog.wait_host(_Never())
    assert aborted == [1]


def test_watchdog_reports_nccl_errors():
    aborted = []

    def probe():
        raise RuntimeError("NCCL_ERROR_REMOTE_ERROR")
    dog = distributed._Watchdog(60, lambda: aborted.append(1), probe, "test")
    dog.track(_Done(), _Never(), "exchange")
    with pytest.raises(RuntimeError, match="got an error from NCCL: NCCL_ERROR_REMOTE_ERROR"):
        dog.wait_host(_Never())
    assert aborted == [1]


def test_watchdog_stays_quiet_while_transfers_finish_and_stops_when_closed():
    dog = distributed._Watchdog(0.1, lambda: pytest.fail("aborted"), lambda: None, "test")
    for _ in range(5):
        dog.track(_Done(), _Done(), "exchange")
    time.sleep(0.3)
    dog.check()
    dog.close()
    dog.track(_Done(), _Never(), "exchange")
    time.sleep(0.3)
    dog.check()


@pytest.mark.parametrize("kw,match", [
    ({"window_size": (-3, 0)}, "window_size must be a pair"),
    ({"layout": "striped"}, "layout must be one of"),
])
def test_ring_attention_refuses_what_it_cannot_do(kw, match):
    x = np.zeros((1, 8, 2, 16), np.float16)
    with pytest.raises(ValueError, match=match):
        distributed.ring_attention(x, x, x, comm=None, **kw)


def test_ring_blocks_checks_its_window():
    with pytest.raises(ValueError, match="window_size must be a pair"):
        ring_blocks(0, 2, 8, True, "zigzag", (-3, 0))


def test_ring_steps_checks_its_arguments():
    with pytest.raises(ValueError, match="local length .7. must be even"):
        ring_steps(1, 2, 7, True, "zigzag")
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_steps(0, 2, 8, True, "striped")
    for world, rank in itertools.product((1, 3), (0,)):
        assert len(ring_steps(rank, world, 4, False)) == world
