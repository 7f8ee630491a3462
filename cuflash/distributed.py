"""Context parallelism: ring attention over NCCL, one sequence split across GPUs.

Each of the P GPUs (ranks) holds a chunk of the sequence's Q, K and V. The K/V chunks travel
around the ring (rank r sends to r + 1 and receives from r - 1) while each rank attends its Q
chunk to the chunk in hand, one block per step; the partial outputs are merged exactly through
the log-sum-exp L that the FlashAttention-2 forward returns:

    L = log(e^L_a + e^L_b),    O = e^(L_a - L) O_a + e^(L_b - L) O_b.

The backward recomputes each block from the merged (global) O and L, so each block's
gradients are exact parts of the whole: dQ_r sums over the steps, and dK_j, dV_j travel
around the ring with their K/V chunk, each rank adding its part, until they come home.

Causal load balance (layout="zigzag"): the sequence is cut into 2P chunks and rank r holds
chunks r and 2P - 1 - r, back to back (zigzag_shard / zigzag_unshard). Every step then costs
every rank the same: one square causal block on its own chunks (step 0), otherwise a full
block of 2c queries by c keys (the source rank's first chunk, which every local query
follows) or of c queries (the local second chunk) by 2c keys (ring_steps).

Sliding windows and ALiBi count over the sequence's positions. Each block then covers one run
of consecutive positions on each side (a chunk), and its mask and ALiBi distances count from
its own diagonal, shifted to where those positions sit in the sequence (ring_blocks; the
kernels take the shift as diag_shift). Blocks that the window hides entirely are skipped.

    from cupy.cuda import nccl
    comm = cuflash.distributed.RingComm(nccl.NcclCommunicator(world, uid, rank))
    q, k, v = (cuflash.distributed.zigzag_shard(x, rank, world) for x in (q_full, ...))
    out, lse = cuflash.distributed.ring_attention(q, k, v, comm, causal=True)
    dq, dk, dv = cuflash.distributed.ring_attention_backward(dout, q, k, v, out, lse, comm,
                                                             causal=True)

Communication runs on the RingComm's own stream, overlapping the compute: the next K/V chunk
is sent while the current one is attended. NCCL is the transport (cupy.cuda.nccl); a watchdog
aborts the communicator when an exchange does not finish within the timeout (a lost peer), so
the next call, or RingComm.synchronize(), raises instead of hanging.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from . import _api
from .reference import Mask, _xp

__all__ = ["RingComm", "ring_attention", "ring_attention_backward", "ring_attention_with_vjp",
           "ring_steps", "ring_blocks", "zigzag_shard", "zigzag_unshard", "LAYOUTS"]

LAYOUTS = ("zigzag", "contiguous")


# --- the layout and the schedule (pure: the CPU tests check them) --------------------------

def zigzag_shard(x, rank: int, world: int, axis: int = 1):
    """Rank `rank`'s part of the full sequence x (its `axis` is the sequence): chunks rank and
    2 world - 1 - rank of 2 world equal chunks, back to back (a copy)."""
    _check_rank(rank, world)
    n = x.shape[axis]
    if n % (2 * world):
        raise ValueError(f"zigzag layout: the sequence length ({n}) must be a multiple of "
                         f"2 x world ({2 * world})")
    chunks = _xp(x).split(x, 2 * world, axis=axis)
    return _xp(x).concatenate([chunks[rank], chunks[2 * world - 1 - rank]], axis=axis)


def zigzag_unshard(parts, axis: int = 1):
    """The full sequence from every rank's zigzag part (a list in rank order): the inverse of
    zigzag_shard."""
    world = len(parts)
    xp = _xp(parts[0])
    halves = [xp.split(p, 2, axis=axis) for p in parts]
    order = [halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))]
    return xp.concatenate(order, axis=axis)


@dataclasses.dataclass(frozen=True)
class RingStep:
    """One block of a step: queries q_rows of the local chunk against keys kv_rows of the
    chunk in hand (which came from rank `src`). causal and window_size are the mask the
    block's kernels apply, FlashAttention-2's convention counted from a diagonal moved by
    diag_shift keys: row i's diagonal is key i + len(kv_rows) - len(q_rows) + diag_shift,
    which puts the block where its queries and keys sit in the whole sequence (ALiBi's
    distances count from the same diagonal)."""
    src: int
    q_rows: slice
    kv_rows: slice
    causal: bool
    window_size: tuple = (-1, -1)
    diag_shift: int = 0


def ring_steps(rank: int, world: int, n_local: int, causal: bool, layout: str = "zigzag"):
    """The block each step of rank `rank` computes (None: nothing to attend). At step s the
    chunk in hand is rank src = (rank - s) mod world's. Positions are global: a query attends
    a key iff the key does not come after it (causal).

    contiguous (rank r holds positions r n .. (r + 1) n - 1): src < r full, src == r causal,
    src > r nothing (rank r does r + 1 blocks: unbalanced).
    zigzag (rank r holds chunks a = r and b = 2P - 1 - r of length c = n / 2): src == r: the
    causal n x n block (a before b, both ways); src < r: every local query follows the source's
    first chunk and precedes its second: all n queries by its first c keys, full; src > r:
    the local first chunk precedes both source chunks, the second follows both: the last c
    queries by all n keys, full."""
    _check_rank(rank, world)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    everything = slice(0, n_local)
    steps = []
    for s in range(world):
        src = (rank - s) % world
        if not causal:
            steps.append(RingStep(src, everything, everything, False))
        elif src == rank:
            steps.append(RingStep(src, everything, everything, True))
        elif layout == "contiguous":
            steps.append(RingStep(src, everything, everything, False) if src < rank else None)
        else:
            if n_local % 2:
                raise ValueError(f"zigzag layout: the local length ({n_local}) must be even "
                                 "(two chunks of equal length)")
            c = n_local // 2
            steps.append(RingStep(src, everything, slice(0, c), False) if src < rank
                         else RingStep(src, slice(c, n_local), everything, False))
    return steps


def _pieces(rank: int, world: int, n_local: int, layout: str) -> list:
    """(local rows, global position of the first) of each run of consecutive positions that
    rank `rank` holds: one (contiguous) or two (zigzag: chunks rank and 2P - 1 - rank)."""
    if layout == "contiguous":
        return [(slice(0, n_local), rank * n_local)]
    if n_local % 2:
        raise ValueError(f"zigzag layout: the local length ({n_local}) must be even "
                         "(two chunks of equal length)")
    c = n_local // 2
    return [(slice(0, c), rank * c), (slice(c, n_local), (2 * world - 1 - rank) * c)]


def ring_blocks(rank: int, world: int, n_local: int, causal: bool, layout: str = "zigzag",
                window_size=(-1, -1), alibi: bool = False) -> list:
    """The blocks each step of rank `rank` computes: a tuple per step (empty: nothing to
    attend). Without a window or ALiBi, ring_steps' one block (a mask over global positions
    that needs no position of its own). With either, every pair of consecutive runs (_pieces:
    the local queries', the source's keys) is a block placed by its diag_shift: skipped
    where the window and causal mask hide every key from every query, unmasked where they
    hide none, else masked (window and causal as given, counted from the shifted diagonal).
    Global positions: query p sees key p' iff p - left <= p' <= p + right (causal: right = 0;
    -1: unbounded), and ALiBi's bias is -slope |p - p'|."""
    if tuple(window_size) == (-1, -1) and not alibi:
        return [() if s is None else (s,) for s in ring_steps(rank, world, n_local, causal,
                                                             layout)]
    _check_rank(rank, world)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    _api._window(causal, window_size, n_local, n_local)  # (its checks)
    window_size = tuple(int(w) for w in window_size)
    steps = []
    for s in range(world):
        src = (rank - s) % world
        blocks = []
        for q_rows, q0 in _pieces(rank, world, n_local, layout):
            for kv_rows, k0 in _pieces(src, world, n_local, layout):
                n_q, n_k = q_rows.stop - q_rows.start, kv_rows.stop - kv_rows.start
                shift = (q0 - k0) - (n_k - n_q)  # (row i's diagonal: key i + q0 - k0)
                lo, hi = Mask(n_q, n_k, causal, *window_size, shift).keys(np.arange(n_q))
                if not (lo <= hi).any():
                    continue  # (no query sees a key of the block)
                if (lo == 0).all() and (hi == n_k - 1).all():  # (every query sees every key)
                    blocks.append(RingStep(src, q_rows, kv_rows, False, (-1, -1),
                                           shift if alibi else 0))
                else:
                    blocks.append(RingStep(src, q_rows, kv_rows, causal, window_size, shift))
        steps.append(tuple(blocks))
    return steps


def merge_partial(xp, out, lse, rows: slice, O_s, L_s) -> None:
    """Merge a partial (O_s, L_s) of rows `rows` into the running float32 (out, lse), in
    place: L = log(e^L + e^L_s), O = e^(L_old - L) O + e^(L_s - L) O_s; rows that saw no key
    in either (L = -inf) keep O = 0, L = -inf. out: (b, n, h, d), lse: (b, h, n)."""
    L_old = lse[:, :, rows]
    L_s = L_s.astype(xp.float32)
    top = xp.maximum(L_old, L_s)
    top = xp.where(xp.isfinite(top), top, xp.float32(0))           # (both -inf: weights 0)
    w_old, w_s = xp.exp(L_old - top), xp.exp(L_s - top)
    total = w_old + w_s                                  # (NaN stays NaN: never "no key")
    safe = xp.where(total == 0, xp.float32(1), total)
    lse[:, :, rows] = xp.where(total == 0, xp.float32(-np.inf), top + xp.log(safe))
    to_rows = lambda w: (w / safe).transpose(0, 2, 1)[..., None]  # noqa: E731  (b, n, h, 1)
    out[:, rows] = out[:, rows] * to_rows(w_old) + O_s.astype(xp.float32) * to_rows(w_s)


def _check_rank(rank: int, world: int) -> None:
    if not (isinstance(world, int) and world >= 1 and isinstance(rank, int)
            and 0 <= rank < world):
        raise ValueError(f"rank must be in 0 .. world - 1 (world >= 1), got rank {rank!r}, "
                         f"world {world!r}")


# --- the ring loop, generic over the transport and the block kernels -----------------------

def _ring_forward(ring, attend, q, k, v, causal: bool, layout: str, window_size=(-1, -1),
                  alibi: bool = False):
    """(out, lse) of the local queries over the whole sequence. ring: the transport
    (rank, world, exchange(sends, recvs) -> handle, wait(handle)); attend(q, k, v, step) ->
    (O_s, L_s), one block's FA2 forward with the RingStep's mask and diagonal."""
    xp = _xp(q)
    batch, n, heads, d = q.shape
    out = xp.zeros((batch, n, heads, d), dtype=xp.float32)
    lse = xp.full((batch, heads, n), -np.inf, dtype=xp.float32)
    steps = ring_blocks(ring.rank, ring.world, n, causal, layout, window_size, alibi)
    for blocks, kv in zip(steps, _chunks_in_hand(ring, k, v)):
        for step in blocks:
            O_s, L_s = attend(q[:, step.q_rows], kv[0][:, step.kv_rows],
                              kv[1][:, step.kv_rows], step)
            merge_partial(xp, out, lse, step.q_rows, O_s, L_s)
    return out.astype(q.dtype), lse


def _chunks_in_hand(ring, k, v):
    """The K/V chunk in hand at each of the ring's steps, this rank's (k, v) first. Each is
    sent on to rank + 1 while the caller's loop body attends it, and the next one received
    from rank - 1 meanwhile (into a spare pair of buffers: never into k, v themselves)."""
    xp = _xp(k)
    kv, spare = (k, v), None
    for s in range(ring.world):
        pending = None
        if s + 1 < ring.world:
            spare = spare or (xp.empty_like(k), xp.empty_like(v))
            pending = ring.exchange(kv, spare)
        yield kv
        if pending is not None:  # (after the body: its reads of kv are queued before)
            ring.wait(pending)
            kv, spare = spare, (kv if kv[0] is not k else None)


def _ring_backward(ring, attend_backward, dout, q, k, v, out, lse, causal: bool, layout: str,
                   window_size=(-1, -1), alibi: bool = False):
    """(dq, dk, dv) of the local chunk. attend_backward(dout, q, k, v, out, lse, step) ->
    one block's (dq, dk, dv) from the global out and lse. dK, dV sums (float32) travel with
    their K/V chunk and come home after world exchanges."""
    xp = _xp(q)
    n = q.shape[1]
    dq = xp.zeros(q.shape, dtype=xp.float32)
    dkv = (xp.zeros(k.shape, dtype=xp.float32), xp.zeros(v.shape, dtype=xp.float32))
    dkv_spare = (xp.empty_like(dkv[0]), xp.empty_like(dkv[1])) if ring.world > 1 else None
    steps = ring_blocks(ring.rank, ring.world, n, causal, layout, window_size, alibi)
    arriving = None
    for blocks, kv in zip(steps, _chunks_in_hand(ring, k, v)):
        for step in blocks:
            qr, kr = step.q_rows, step.kv_rows
            lse_rows = xp.ascontiguousarray(lse[:, :, qr])
            dq_s, dk_s, dv_s = attend_backward(dout[:, qr], q[:, qr], kv[0][:, kr],
                                               kv[1][:, kr], out[:, qr], lse_rows, step)
            if arriving is not None:  # this chunk's dK, dV sums so far, from rank - 1
                ring.wait(arriving)   # (after the first block is queued: it overlaps)
                arriving = None
            dq[:, qr] += dq_s.astype(xp.float32)
            dkv[0][:, kr] += dk_s.astype(xp.float32)
            dkv[1][:, kr] += dv_s.astype(xp.float32)
        if arriving is not None:  # (a step with no block)
            ring.wait(arriving)
        if ring.world > 1:  # pass the sums on with the chunk (the last exchange brings
            arriving = ring.exchange(dkv, dkv_spare)  # this rank's own home)
            dkv, dkv_spare = dkv_spare, dkv
    if arriving is not None:
        ring.wait(arriving)
    return dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype)


# --- CUDA: cuflash's kernels, NCCL on its own stream ---------------------------------------

class _Watchdog:
    """Gives up on transfers that do not finish. Transfers run one after another on the comm
    stream, each once the work queued before it is done; a thread polls them in order and
    starts a transfer's clock only when it can run (its `ready` event done, every earlier
    transfer finished), so work queued far ahead never counts against it. Past `timeout`
    seconds, on an error from `probe()` (NCCL's asynchronous error), or when one NCCL call on
    the host (`calling`) blocks that long, it records the problem and calls `abort()` once.
    NCCL alone would wait for a lost peer forever. Events: objects with .done."""

    def __init__(self, timeout: float, abort, probe, name: str, on_start=None):
        self.timeout, self._abort, self._probe = timeout, abort, probe
        self.error: str | None = None
        self._lock = threading.Lock()
        self._pending: list = []  # [ready, done, what, started (monotonic) or None]
        self._call: tuple | None = None  # (what, since) while the host is inside NCCL
        self._closed = False
        self._wake = threading.Event()
        self._on_start = on_start
        threading.Thread(target=self._run, daemon=True, name=name).start()

    def track(self, ready, done, what: str) -> None:
        with self._lock:
            self._pending.append([ready, done, what, None])
        self._wake.set()

    def calling(self, what: str | None) -> None:
        """The host enters (what) or leaves (None) a blocking NCCL call."""
        self._call = None if what is None else (what, time.monotonic())
        if what is not None:
            self._wake.set()

    def wait_host(self, event) -> None:
        """Wait on the host for one event; raises RuntimeError once the watchdog gave up."""
        while not event.done:
            self.check()
            time.sleep(0.0005)
        self.check()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(self.error)

    def fail(self, problem: str) -> None:
        """Record a problem and abort (once, from whichever thread sees it first)."""
        with self._lock:
            if self.error is not None:
                return
            self.error = f"ring attention {problem}; the communicator was aborted"
        self._abort()

    def pending(self) -> list:
        with self._lock:
            return [p[1] for p in self._pending]

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while self.error is None and not self._closed:
            now = time.monotonic()
            with self._lock:
                while self._pending and self._pending[0][1].done:
                    self._pending.pop(0)
                head = self._pending[0] if self._pending else None
                if head is not None and head[3] is None and head[0].done:
                    head[3] = now  # (it can run from now on)
            call = self._call
            if head is None and call is None:
                self._wake.wait()
                self._wake.clear()
                continue
            if call is not None and now - call[1] > self.timeout:
                self.fail(f"was blocked in an NCCL {call[0]} call for more than "
                          f"{self.timeout:g} s (a lost or stalled peer)")
                return
            if head is not None and head[3] is not None and now - head[3] > self.timeout:
                self.fail(f"did not finish an NCCL {head[2]} within {self.timeout:g} s (a lost "
                          "or stalled peer)")
                return
            try:
                self._probe()
            except Exception as exc:  # (NcclError)
                self.fail(f"got an error from NCCL: {exc}")
                return
            self._wake.wait(0.05)
            self._wake.clear()


class RingComm:
    """An NCCL communicator (cupy.cuda.nccl.NcclCommunicator, one per process and GPU) as the
    ring's transport: its own CUDA stream for the transfers, and a watchdog that aborts the
    communicator when a transfer that could run has not finished after `timeout` seconds, or
    NCCL reports an error (a lost or stalled peer). After that every call raises
    RuntimeError. Create it on the GPU the communicator was made for; `close()` (or a `with`
    block) stops the watchdog."""

    def __init__(self, comm, timeout: float = 300.0):
        cupy = _api._cupy()
        if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.handle, self.comm, self.timeout = comm, comm, float(timeout)
        self.rank, self.world = comm.rank_id(), comm.size()
        self.device = comm.device_id()
        with cupy.cuda.Device(self.device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self._nccl_lock = threading.Lock()  # (NCCL calls against the watchdog's abort)
        self._agreed: set = set()
        self._watchdog = _Watchdog(self.timeout, self._abort, self._probe,
                                   f"cuflash-ring-watchdog-{self.rank}",
                                   on_start=lambda: cupy.cuda.Device(self.device).use())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        """Stop the watchdog (the NCCL communicator itself stays the caller's)."""
        self._watchdog.close()
        _rings.pop(id(self.handle), None)

    def _abort(self) -> None:
        # From the watchdog's thread. Where the host is blocked inside an NCCL call holding
        # the lock (a connection to a lost peer), abort without it: nothing else frees it.
        got = self._nccl_lock.acquire(timeout=1.0)
        try:
            comm, self.comm = self.comm, None
            if comm is not None:
                comm.abort()  # (NCCL's kernels waiting on the lost peer return)
        finally:
            if got:
                self._nccl_lock.release()

    def _probe(self) -> None:
        comm = self.comm
        if comm is not None:
            comm.check_async_error()

    def check(self) -> None:
        """Raises RuntimeError where the watchdog gave up (the communicator is aborted)."""
        self._watchdog.check()

    def _enqueue(self, what: str, calls) -> object:
        """Run NCCL calls (a function of the communicator and the comm stream's pointer) on
        the comm stream after the current stream's work so far; returns their completion
        event, watched. An NCCL error raised here aborts the communicator too."""
        from cupy.cuda import nccl
        cupy = _api._cupy()
        self.check()
        ready = cupy.cuda.Event(block=False, disable_timing=True)
        ready.record()
        self.stream.wait_event(ready)
        failure = None
        with self._nccl_lock:
            self.check()
            self._watchdog.calling(what)
            try:
                nccl.groupStart()
                try:
                    calls(self.comm, self.stream.ptr)
                finally:
                    nccl.groupEnd()
            except Exception as exc:  # (NcclError: NCCL saw a peer go, say)
                failure = exc
            finally:
                self._watchdog.calling(None)
        if failure is not None:
            self._watchdog.fail(f"got an error from NCCL on rank {self.rank} ({what}): "
                                f"{failure}")
            self.check()
        done = cupy.cuda.Event(block=False, disable_timing=True)
        done.record(self.stream)
        self._watchdog.track(ready, done, what)
        return done

    # the transport interface of _ring_forward / _ring_backward
    def exchange(self, sends, recvs):
        """Send each (C-contiguous) array of `sends` to rank + 1 and receive each of `recvs`
        (same shapes) from rank - 1, on the comm stream, after the current stream's work so
        far (which may still read the arrays `recvs` replace). Returns the completion event."""
        from cupy.cuda import nccl
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world

        def calls(comm, stream):
            for x in sends:
                comm.send(x.data.ptr, x.nbytes, nccl.NCCL_UINT8, nxt, stream)
            for x in recvs:
                comm.recv(x.data.ptr, x.nbytes, nccl.NCCL_UINT8, prv, stream)
        return self._enqueue("exchange", calls)

    def wait(self, done) -> None:
        """The current stream waits (on the GPU) for a transfer."""
        _api._cupy().cuda.get_current_stream().wait_event(done)

    def _all_gather(self, what: str, row):
        """Every rank's `row` (uint8 NumPy), gathered and waited on the host."""
        from cupy.cuda import nccl
        cupy = _api._cupy()
        with cupy.cuda.Device(self.device):
            send = cupy.asarray(row)
            recv = cupy.empty((self.world, row.size), dtype=cupy.uint8)
            done = self._enqueue(what, lambda comm, stream: comm.allGather(
                send.data.ptr, recv.data.ptr, row.size, nccl.NCCL_UINT8, stream))
            self._watchdog.wait_host(done)
            return cupy.asnumpy(recv)

    def agree(self, key: tuple) -> None:
        """Every rank must call with the same local shapes and options (NCCL's transfers carry
        no sizes to compare): checked once per key by an all-gather (a synchronisation)."""
        if key in self._agreed:
            return
        mine = np.frombuffer(repr(key).encode().ljust(256)[:256], dtype=np.uint8)
        every = self._all_gather("all-gather", mine)
        differ = [r for r in range(self.world) if not (every[r] == mine).all()]
        if differ:
            raise ValueError(f"ring attention: ranks {differ} called with other shapes, dtypes "
                             f"or options than rank {self.rank} ({key}); every rank must pass "
                             "the same")
        self._agreed.add(key)

    def barrier(self) -> None:
        """Return once every rank has called barrier (a one-byte all-gather, waited on the
        host); raises RuntimeError where a peer never comes (the watchdog's timeout)."""
        self._all_gather("barrier", np.zeros(1, dtype=np.uint8))

    def synchronize(self) -> None:
        """Wait until every transfer issued so far has finished; raises RuntimeError where
        the watchdog gave up on one (a lost peer) or NCCL reported an error."""
        for e in self._watchdog.pending():
            self._watchdog.wait_host(e)
        self.check()


_rings: dict = {}


def _ring(comm):
    """The RingComm of a raw NCCL communicator (made once, kept until its close())."""
    if isinstance(comm, RingComm):
        return comm
    ring = _rings.get(id(comm))
    if ring is None or ring.handle is not comm:
        ring = _rings[id(comm)] = RingComm(comm)
    return ring


def _prepare(which, q, k, v, comm, causal, softmax_scale, softcap, layout, window_size,
             alibi_slopes) -> tuple:
    """A ring call's checks: (its RingComm, causal as a bool, k and v C-contiguous: NCCL sends
    them as bytes); the shapes and options agreed with every rank (once per key)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    causal = _api._check_flag("causal", causal)
    _api._window(causal, window_size, q.shape[1], k.shape[1])  # (its checks, at once)
    window_size = tuple(int(w) for w in window_size)
    cupy, device_id, _ = _api._check_qkv(q, k, v)
    _api._hook(cupy, softcap, alibi_slopes, q)  # (its checks, before any transfer)
    ring = _ring(comm)
    if device_id != ring.device:
        raise ValueError(f"q is on GPU {device_id}, the communicator on GPU {ring.device}")
    slopes = None if alibi_slopes is None else (str(alibi_slopes.dtype), alibi_slopes.shape)
    k, v = _contiguous(k), _contiguous(v)
    ring.agree((which, q.shape, k.shape, str(q.dtype), causal, softmax_scale, softcap, layout,
                window_size, slopes))
    return ring, causal, k, v, window_size


def _contiguous(x):
    return x if x.flags.c_contiguous else _api._cupy().ascontiguousarray(x)


def _block_kernels(softmax_scale, softcap, alibi_slopes) -> tuple:
    """(attend, attend_backward) of _ring_forward / _ring_backward: cuflash's forward and
    backward on one block, with its RingStep's mask and diagonal shift."""
    def attend(qb, kb, vb, step):
        return _api._forward(qb, kb, vb, step.causal, softmax_scale, None, None, "fa2", False,
                             None, step.window_size, softcap, alibi_slopes,
                             diag_shift=step.diag_shift)

    def attend_backward(dob, qb, kb, vb, ob, lb, step):
        return _api._backward(dob, qb, kb, vb, ob, lb, step.causal, softmax_scale, False, None,
                              None, None, None, step.window_size, softcap, alibi_slopes,
                              diag_shift=step.diag_shift)
    return attend, attend_backward


def ring_attention(q, k, v, comm, causal: bool = False, softmax_scale: float | None = None,
                   *, softcap: float = 0.0, layout: str = "zigzag", window_size=(-1, -1),
                   alibi_slopes=None):
    """The forward of attention over a sequence split across the ring's GPUs.

    q, k, v : this rank's chunk, (batch, n_local, heads, d) / (batch, n_local, heads_k, d),
        the same shapes on every rank (the rules of :func:`cuflash.forward`).
    comm : a RingComm, or a cupy.cuda.nccl.NcclCommunicator (wrapped in a RingComm, kept).
    causal : the mask over global positions; the chunks must be in `layout`: "zigzag"
        (zigzag_shard: balanced) or "contiguous" (rank r holds the r-th of P equal parts).
        Without causal, any equal split works.
    softmax_scale, softcap : as :func:`cuflash.forward`.
    window_size, alibi_slopes : as :func:`cuflash.forward`, over global positions (the
        sequence's, not the chunk's): query p sees key p' iff p - left <= p' <= p + right, and
        ALiBi's bias is -slope |p - p'|. The chunks must then be in `layout` also without
        causal.

    Returns (out, lse) of this rank's queries over the whole sequence: out like q, lse
    float32 (batch, heads, n_local). Runs on the current stream; the transfers on the comm's.
    """
    ring, causal, k, v, window_size = _prepare("fwd", q, k, v, comm, causal, softmax_scale,
                                               softcap, layout, window_size, alibi_slopes)
    attend, _ = _block_kernels(softmax_scale, softcap, alibi_slopes)
    with _api._on_device(_api._cupy(), ring.device):
        return _ring_forward(ring, attend, q, k, v, causal, layout, window_size,
                             alibi_slopes is not None)


def ring_attention_backward(dout, q, k, v, out, lse, comm, causal: bool = False,
                            softmax_scale: float | None = None, *, softcap: float = 0.0,
                            layout: str = "zigzag", window_size=(-1, -1), alibi_slopes=None):
    """Gradients of :func:`ring_attention` for this rank's chunk: (dq, dk, dv) like q, k, v.
    Every rank calls it with the same options as the forward."""
    ring, causal, k, v, window_size = _prepare("bwd", q, k, v, comm, causal, softmax_scale,
                                               softcap, layout, window_size, alibi_slopes)
    _, attend_backward = _block_kernels(softmax_scale, softcap, alibi_slopes)
    with _api._on_device(_api._cupy(), ring.device):
        return _ring_backward(ring, attend_backward, dout, q, k, v, out, lse, causal, layout,
                              window_size, alibi_slopes is not None)


def ring_attention_with_vjp(q, k, v, comm, causal: bool = False,
                            softmax_scale: float | None = None, *, softcap: float = 0.0,
                            layout: str = "zigzag", window_size=(-1, -1), alibi_slopes=None):
    """``out, vjp = ring_attention_with_vjp(...)``; ``dq, dk, dv = vjp(dout)``. Residuals: q,
    k, v, out and lse of the local chunk (no N x N matrix)."""
    kw = dict(softcap=softcap, layout=layout, window_size=window_size,
              alibi_slopes=alibi_slopes)
    out, lse = ring_attention(q, k, v, comm, causal, softmax_scale, **kw)

    def vjp(dout):
        return ring_attention_backward(dout, q, k, v, out, lse, comm, causal, softmax_scale,
                                       **kw)
    return out, vjp
