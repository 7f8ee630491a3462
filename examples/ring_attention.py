"""Ring attention over NCCL: one long sequence split across the GPUs of one machine.

    python examples/ring_attention.py                          # every visible GPU, 128k tokens
    python examples/ring_attention.py --gpus 2 --seqlen 262144 --heads 16 --headdim 128

One process per GPU. The parent makes the NCCL unique id and hands it to the workers
(multiprocessing, spawn); each worker makes its communicator, builds its zigzag part of the
sequence (chunks rank and 2P - 1 - rank, generated chunk by chunk from a seed, so no process
ever holds the whole sequence), and runs the causal forward and backward of
cuflash.distributed.ring_attention, timed with CUDA events. `--check` (short sequences) also
gathers the parts and compares them with cuflash's single-GPU result on the whole sequence.

run_rank() is also what tests/test_distributed_gpu.py and bench/ring_bench.py start.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def chunk(seed: int, which: int, index: int, batch, c, heads, d, dtype):
    """Chunk `index` (c tokens) of tensor `which` (0 q, 1 k, 2 v, 3 dout) of the sequence:
    the same values whichever process and however many GPUs make it."""
    import cupy as cp
    rs = cp.random.RandomState(seed * 1000003 + which * 65537 + index)
    return rs.standard_normal((batch, c, heads, d), dtype=cp.float32).astype(dtype)


def alibi_slopes(job: dict):
    """The job's ALiBi slopes, float32 (batch, heads), as NumPy: the same in every process."""
    import numpy as np
    rng = np.random.default_rng(job["seed"] + 7)
    return (0.3 * rng.random((job["batch"], job["heads"]))).astype(np.float32)


def local_part(job: dict, which: int, rank: int, world: int):
    """This rank's zigzag part of one tensor: chunks rank and 2 world - 1 - rank."""
    import cupy as cp
    heads = job["heads_k"] if which in (1, 2) else job["heads"]
    c = job["seqlen"] // (2 * world)
    return cp.concatenate([chunk(job["seed"], which, i, job["batch"], c, heads, job["headdim"],
                                 job["dtype"]) for i in (rank, 2 * world - 1 - rank)], axis=1)


def full_sequence(job: dict, which: int, world: int):
    """The whole tensor that the ranks' parts come from (on the current GPU)."""
    import cupy as cp
    heads = job["heads_k"] if which in (1, 2) else job["heads"]
    c = job["seqlen"] // (2 * world)
    return cp.concatenate([chunk(job["seed"], which, i, job["batch"], c, heads, job["headdim"],
                                 job["dtype"]) for i in range(2 * world)], axis=1)


def run_rank(rank: int, world: int, uid, job: dict, results) -> None:
    """One worker: job["mode"] is "check" (return out, lse and the gradients of the local part
    as NumPy arrays), "time" (seconds per forward + backward step with the ring and with the
    compute alone, and the CuPy pool's size after each, about the peak), "single" (world 1:
    the same figures for cuflash on the whole sequence) or "lost_peer" (rank 1 leaves after
    the communicator is made; rank 0 reports the error it gets, or that it got none)."""
    try:
        results.put((rank, _run(rank, world, uid, job)))
    except BaseException as exc:  # noqa: BLE001  (reported to the parent, which raises)
        results.put((rank, {"error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()}))


def _run(rank, world, uid, job):
    import cupy as cp
    from cupy.cuda import nccl

    from cuflash import distributed

    cp.cuda.Device(rank).use()
    comm = nccl.NcclCommunicator(world, uid, rank)
    if job["mode"] == "lost_peer":  # one whole call together, then rank 1 dies (no goodbye)
        ring = distributed.RingComm(comm, timeout=job["timeout"])
        q, k, v = (local_part(job, w, rank, world) for w in range(3))
        distributed.ring_attention(q, k, v, ring, causal=True)
        ring.synchronize()
        ring.barrier()
        if rank == 1:
            os._exit(0)
        t0 = time.monotonic()
        try:  # (the shapes are agreed already: only the ring's transfers wait on the peer)
            distributed.ring_attention(q, k, v, ring, causal=True)
            ring.synchronize()
        except RuntimeError as exc:
            return {"raised": str(exc), "seconds": time.monotonic() - t0}
        return {"raised": None, "seconds": time.monotonic() - t0}

    if job["mode"] == "single":  # (world 1: cuflash on the whole sequence, the baseline)
        return _time_single(job)
    ring = distributed.RingComm(comm, timeout=job.get("timeout", 300.0))
    causal, layout = job["causal"], "zigzag"
    q, k, v, dout = (local_part(job, w, rank, world) for w in range(4))
    kw = dict(causal=causal, softcap=job.get("softcap", 0.0), layout=layout,
              window_size=tuple(job.get("window_size", (-1, -1))),
              alibi_slopes=cp.asarray(alibi_slopes(job)) if job.get("alibi") else None)

    def step():
        out, lse = distributed.ring_attention(q, k, v, ring, **kw)
        grads = distributed.ring_attention_backward(dout, q, k, v, out, lse, ring, **kw)
        return out, lse, grads

    if job["mode"] == "check":
        out, lse, grads = step()
        ring.synchronize()
        return {"out": cp.asnumpy(out), "lse": cp.asnumpy(lse),
                "grads": [cp.asnumpy(g) for g in grads]}

    # "time": the step with the ring, and with a transport that moves nothing (the compute
    # alone, same blocks): the difference is the communication the compute did not hide.
    pool = cp.get_default_memory_pool()
    step()  # (compiles; the NCCL connections are set up)
    ring.synchronize()
    timings = {}
    for name, transport in (("ring", None), ("compute", _NoTransport(rank, world))):
        times, used = [], 0
        for _ in range(job["reps"]):
            pool.free_all_blocks()
            ring.barrier()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            if transport is None:
                step()
            else:
                _compute_only(transport, q, k, v, dout, **kw)
            end.record()
            end.synchronize()
            ring.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
            free, total = cp.cuda.runtime.memGetInfo()
            used = max(used, total - free)
        timings[name] = sorted(times)[len(times) // 2]
        timings[name + "_pool_bytes"] = pool.total_bytes()
        timings[name + "_device_bytes"] = used  # (the pool, NCCL's buffers, the context)
    return timings


def _time_single(job):
    """cuflash.forward + backward on the whole sequence on this GPU (CUDA events, median)."""
    import cupy as cp

    import cuflash
    q, k, v, dout = (full_sequence(job, w, 1) for w in range(4))
    kw = dict(causal=job["causal"], softcap=job.get("softcap", 0.0))

    def step():
        out, lse = cuflash.forward(q, k, v, **kw)
        cuflash.backward(dout, q, k, v, out, lse, **kw)
    pool = cp.get_default_memory_pool()
    step()
    times = []
    for _ in range(job["reps"]):
        pool.free_all_blocks()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    t = sorted(times)[len(times) // 2]
    free, total = cp.cuda.runtime.memGetInfo()
    return {"ring": t, "compute": t, "ring_pool_bytes": pool.total_bytes(),
            "compute_pool_bytes": pool.total_bytes(), "ring_device_bytes": total - free,
            "compute_device_bytes": total - free}


class _NoTransport:
    """The ring's transport with no transfers: each 'received' chunk is whatever the buffer
    held. The same blocks are computed; for timing the compute alone, never for results."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def exchange(self, sends, recvs):
        return None  # (nothing pending: each step attends this rank's own chunk again)

    def wait(self, handle):
        pass


def _compute_only(transport, q, k, v, dout, causal, softcap, layout, window_size,
                  alibi_slopes):
    from cuflash import distributed

    attend, attend_backward = distributed._block_kernels(None, softcap, alibi_slopes)
    alibi = alibi_slopes is not None
    out, lse = distributed._ring_forward(transport, attend, q, k, v, causal, layout,
                                         window_size, alibi)
    distributed._ring_backward(transport, attend_backward, dout, q, k, v, out, lse, causal,
                               layout, window_size, alibi)


def launch(world: int, job: dict, timeout: float = 600.0) -> list:
    """Start `world` workers on GPUs 0 .. world - 1 and return their results in rank order;
    raises RuntimeError with a worker's traceback where one failed."""
    from cupy.cuda import nccl
    ctx = mp.get_context("spawn")
    uid = nccl.get_unique_id()
    results = ctx.Queue()
    procs = [ctx.Process(target=run_rank, args=(r, world, uid, job, results))
             for r in range(world)]
    for p in procs:
        p.start()
    expected = {0} if job["mode"] == "lost_peer" else set(range(world))
    got, deadline = {}, time.monotonic() + timeout
    try:
        while not expected <= set(got):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"workers did not report within {timeout:g} s")
            try:
                rank, res = results.get(timeout=min(left, 2.0))
            except queue.Empty:  # a worker that died says nothing: stop at once
                dead = [r for r, p in enumerate(procs) if r in expected and r not in got
                        and p.exitcode is not None]
                if dead and results.empty():
                    raise RuntimeError(f"worker(s) {dead} exited without a result (exit codes "
                                       f"{[procs[r].exitcode for r in dead]})") from None
                continue
            if "error" in res:
                raise RuntimeError(f"rank {rank}: {res['error']}\n{res['traceback']}")
            got[rank] = res
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return [got[r] for r in sorted(got)]


def check(world: int, job: dict) -> int:
    """Gather the ring's results and compare them with cuflash on one GPU, whole sequence."""
    import cupy as cp
    import numpy as np

    import cuflash
    from cuflash.distributed import zigzag_unshard
    res = launch(world, job)
    q, k, v, dout = (full_sequence(job, w, world) for w in range(4))
    out, lse = cuflash.forward(q, k, v, causal=job["causal"])
    grads = cuflash.backward(dout, q, k, v, out, lse, causal=job["causal"])
    worst = 0.0
    for name, ring, one in [("out", zigzag_unshard([r["out"] for r in res]), out),
                            ("lse", zigzag_unshard([r["lse"] for r in res], axis=2), lse)] + [
            (n, zigzag_unshard([r["grads"][i] for r in res]), g)
            for i, (n, g) in enumerate(zip(("dq", "dk", "dv"), grads))]:
        diff = float(np.abs(ring.astype(np.float64) - cp.asnumpy(one).astype(np.float64)).max())
        worst = max(worst, diff)
        print(f"{name}: max |ring - one GPU| = {diff:.3e}")
    return 0 if worst < 0.1 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=0, help="default: every visible GPU")
    ap.add_argument("--seqlen", type=int, default=131072)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="compare with cuflash on one GPU (a short sequence: --seqlen 4096)")
    args = ap.parse_args(argv)
    from cuflash._api import gpu_missing
    if gpu_missing():
        print(f"ring_attention.py: {gpu_missing()}. Nothing was run.", file=sys.stderr)
        return 2
    import cupy as cp
    import ml_dtypes
    world = args.gpus or cp.cuda.runtime.getDeviceCount()
    job = dict(mode="time", seqlen=args.seqlen, batch=args.batch, heads=args.heads,
               heads_k=args.kv_heads or args.heads, headdim=args.headdim,
               dtype=ml_dtypes.bfloat16, causal=not args.no_causal, seed=0, reps=args.reps)
    if args.check:
        return check(world, dict(job, mode="check"))
    res = launch(world, job)
    ring = max(r["ring"] for r in res)
    flops = 4 * args.batch * args.heads * args.seqlen ** 2 * args.headdim * 3.5
    flops *= 0.5 if job["causal"] else 1.0
    print(f"{world} GPU(s), {args.seqlen} tokens, forward + backward: {ring * 1e3:.1f} ms per "
          f"step, {args.batch * args.seqlen / ring:,.0f} tokens/s, "
          f"{flops / ring / 1e12 / world:.0f} TFLOP/s per GPU; communication not hidden: "
          f"{max(r['ring'] - r['compute'] for r in res) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
