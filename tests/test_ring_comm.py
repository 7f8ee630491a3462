"""CPU: RingComm, the ring's NCCL transport (cuflash.distributed), against stand-ins for CuPy's
streams and events and for an NCCL communicator: what it asks NCCL to do (peers, sizes,
groups, the comm stream), how it agrees on shapes with the other ranks, and that an NCCL
error or a lost peer becomes the documented RuntimeError with the communicator aborted. The
real NCCL runs in test_distributed_gpu.py (2 GPUs)."""

import sys
import threading
import time
import types

import numpy as np
import pytest

from cuflash import _api, distributed


class Event:
    def __init__(self, block=False, disable_timing=True):
        self.done, self.stream = False, None

    def record(self, stream=None):
        self.stream = stream
        self.done = stream is None or stream.finish


class Stream:
    def __init__(self, non_blocking=False):
        self.ptr, self.waited, self.finish = 77, [], True

    def wait_event(self, event):
        self.waited.append(event)


class Array:
    """A host array at a fake device address (registered, so that the stand-in NCCL can read
    and write it by address)."""
    memory: dict = {}
    _next = [1 << 40]

    def __init__(self, a):
        self.a = np.ascontiguousarray(a)
        self.data = types.SimpleNamespace(ptr=Array._next[0])
        Array._next[0] += self.a.nbytes + 256
        Array.memory[self.data.ptr] = self.a

    nbytes = property(lambda self: self.a.nbytes)


class Device:
    def __init__(self, i=0):
        self.id = i

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def use(self):
        pass


def _fake_cupy(current):
    cp = types.SimpleNamespace()
    cp.uint8 = np.uint8
    cp.asarray = lambda a: Array(np.asarray(a))
    cp.empty = lambda shape, dtype=np.float32: Array(np.zeros(shape, dtype))
    cp.asnumpy = lambda x: x.a.copy()
    cp.cuda = types.SimpleNamespace(Event=Event, Stream=Stream, Device=Device,
                                    get_current_stream=lambda: current)
    return cp


class Comm:
    """A stand-in NCCL communicator of `rank` in `world`; allGather fills in the other ranks'
    rows from `others` (rank -> bytes)."""

    def __init__(self, rank, world, others=None, fail=None):
        self.rank, self.world, self.others, self.fail = rank, world, others or {}, fail
        self.calls, self.aborted = [], False

    rank_id = lambda self: self.rank  # noqa: E731
    size = lambda self: self.world  # noqa: E731
    device_id = lambda self: 0  # noqa: E731

    def send(self, ptr, count, dtype, peer, stream):
        if self.fail:
            raise RuntimeError(self.fail)
        self.calls.append(("send", ptr, count, dtype, peer, stream))

    def recv(self, ptr, count, dtype, peer, stream):
        self.calls.append(("recv", ptr, count, dtype, peer, stream))

    def allGather(self, send, recv, count, dtype, stream):  # noqa: N802  (NCCL's name)
        self.calls.append(("allGather", send, recv, count, dtype, stream))
        rows = Array.memory[recv].reshape(self.world, count)
        for r in range(self.world):
            rows[r] = Array.memory[send] if r == self.rank else \
                np.frombuffer(self.others.get(r, Array.memory[send].tobytes()), np.uint8)

    def check_async_error(self):
        pass

    def abort(self):
        self.aborted = True


@pytest.fixture
def ring_env(monkeypatch):
    groups = []
    nccl = types.SimpleNamespace(NCCL_UINT8=7, groupStart=lambda: groups.append("start"),
                                 groupEnd=lambda: groups.append("end"))
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    monkeypatch.setattr(cupy.cuda, "nccl", nccl, raising=False)
    current = Stream()
    monkeypatch.setattr(_api, "_cupy", lambda: _fake_cupy(current))
    return types.SimpleNamespace(groups=groups, current=current)


def test_exchange_sends_to_the_next_rank_and_receives_from_the_previous(ring_env):
    comm = Comm(rank=0, world=3)
    ring = distributed.RingComm(comm, timeout=30)
    sends = [Array(np.zeros((2, 8), np.float16)), Array(np.zeros((2, 8), np.float16))]
    recvs = [Array(np.zeros((2, 8), np.float16)), Array(np.zeros((2, 8), np.float16))]
    done = ring.exchange(sends, recvs)
    assert ring_env.groups == ["start", "end"]
    assert [c[0] for c in comm.calls] == ["send", "send", "recv", "recv"]
    for (kind, ptr, count, dtype, peer, stream), x in zip(comm.calls, sends + recvs):
        assert (ptr, count, dtype, stream) == (x.data.ptr, 32, 7, ring.stream.ptr)
        assert peer == (1 if kind == "send" else 2)  # rank 0 of 3: next 1, previous 2
    # the comm stream first waits for the compute queued so far; compute waits on `done`
    assert len(ring.stream.waited) == 1 and ring.stream.waited[0].stream is None
    ring.wait(done)
    assert ring_env.current.waited == [done]
    ring.synchronize()
    ring.close()


def test_agree_finds_the_ranks_that_differ(ring_env):
    key = ("fwd", (1, 8, 2, 16))
    mine = repr(key).encode().ljust(256)
    other = repr(("fwd", (1, 9, 2, 16))).encode().ljust(256)
    ring = distributed.RingComm(Comm(rank=1, world=3, others={0: mine, 2: other}), timeout=30)
    with pytest.raises(ValueError, match=r"ranks \[2\] called with other shapes"):
        ring.agree(key)
    ring2 = distributed.RingComm(Comm(rank=1, world=3, others={0: mine, 2: mine}), timeout=30)
    ring2.agree(key)
    ring2.agree(key)  # (once per key: no second all-gather)
    assert [c[0] for c in ring2.comm.calls] == ["allGather"]
    ring.close()
    ring2.close()


def test_an_nccl_error_while_queueing_aborts_and_raises(ring_env):
    comm = Comm(rank=0, world=2, fail="NCCL_ERROR_REMOTE_ERROR: peer gone")
    ring = distributed.RingComm(comm, timeout=30)
    x = Array(np.zeros(4, np.float32))
    with pytest.raises(RuntimeError, match=r"ring attention got an error from NCCL on rank 0 "
                                           r"\(exchange\): NCCL_ERROR_REMOTE_ERROR"):
        ring.exchange([x], [Array(np.zeros(4, np.float32))])
    assert comm.aborted and ring_env.groups == ["start", "end"]
    with pytest.raises(RuntimeError, match="communicator was aborted"):
        ring.exchange([x], [x])  # (every later call)
    ring.close()


def test_a_transfer_that_never_ends_aborts_within_the_timeout(ring_env):
    comm = Comm(rank=0, world=2)
    ring = distributed.RingComm(comm, timeout=0.2)
    ring.stream.finish = False  # (the peer never answers: the comm stream never drains)
    x = Array(np.zeros(4, np.float32))
    ring.exchange([x], [Array(np.zeros(4, np.float32))])
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish an NCCL exchange within 0.2 s"):
        ring.synchronize()
    assert time.monotonic() - t0 < 5 and comm.aborted
    ring.close()


def test_the_watchdog_thread_stops_on_close(ring_env):
    # (the ring's own thread, by identity: counting all of the process's threads failed once
    # in the GPU suite, where another test's thread ended between the two counts)
    before = set(threading.enumerate())
    ring = distributed.RingComm(Comm(rank=0, world=2), timeout=30)
    started = [t for t in threading.enumerate()
               if t not in before and t.name == "cuflash-ring-watchdog-0"]
    assert len(started) == 1 and started[0].is_alive()
    ring.close()
    started[0].join(timeout=1)
    assert not started[0].is_alive()
