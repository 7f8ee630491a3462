"""Ring attention (cuflash.distributed) on 1 and on 2+ GPUs, in one run.

    python bench/ring_bench.py                                # 128k .. 1M tokens, 2 GPUs
    python bench/ring_bench.py --seqlens 131072,262144 --gpus 2 --json out.json

Causal, bf16, 16 heads, d 128, batch 1 (the issue's grid). One GPU: cuflash.forward +
backward on the whole sequence (a worker process of its own). P GPUs: the zigzag ring's
forward + backward step (examples/ring_attention.py's workers, one process per GPU). Per
point: seconds per step (CUDA events, the median of --reps after a warm-up step, the slowest
rank), tokens/s, the scaling factor (one GPU's time / P GPUs' time), the compute time (the
same ring step with a transport that moves nothing) and the communication it did not hide
(step - compute), and memory per GPU: the CuPy pool's size after the step (about the peak of
what the step allocates: the pool is emptied before it) and the device's memory in use
(cudaMemGetInfo: the pool, NCCL's buffers and the context).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (no_gpu, script_results)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="131072,262144,524288,1048576")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3, help="(1 from 512k tokens up)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if bench.no_gpu("ring_bench.py"):
        return 2
    import cupy as cp
    import ml_dtypes
    import ring_attention as ring
    have = cp.cuda.runtime.getDeviceCount()
    if have < args.gpus:
        print(f"ring_bench.py: {args.gpus} GPUs asked for, {have} visible. Nothing was run.",
              file=sys.stderr)
        return 2
    rows = []
    for n in (int(s) for s in args.seqlens.split(",")):
        job = dict(seqlen=n, batch=1, heads=args.heads, heads_k=args.heads,
                   headdim=args.headdim, dtype=ml_dtypes.bfloat16, causal=True, seed=0,
                   reps=args.reps if n < 524288 else 1)
        flops = 4 * n * n * args.heads * args.headdim * 0.5 * 3.5
        row = {"seqlen": n, "heads": args.heads, "headdim": args.headdim, "dtype": "bf16",
               "causal": True}
        for world in (1, args.gpus):
            res = ring.launch(world, dict(job, mode="single" if world == 1 else "time"),
                              timeout=3000)
            step = max(r["ring"] for r in res)
            compute = max(r["compute"] for r in res)
            row[f"gpus{world}"] = {
                "step_s": step, "compute_s": compute, "exposed_comm_s": step - compute,
                "tokens_per_s": n / step, "tflops_per_gpu": flops / step / 1e12 / world,
                "pool_gib_per_gpu": [r["ring_pool_bytes"] / 2**30 for r in res],
                "device_used_gib_per_gpu": [r["ring_device_bytes"] / 2**30 for r in res]}
            print(f"n={n:8d} gpus={world}: {step:8.3f} s per step, {n / step:10,.0f} tokens/s, "
                  f"{flops / step / 1e12 / world:4.0f} TFLOP/s per GPU, compute {compute:.3f} s,"
                  f" exposed comm {step - compute:.3f} s, pool "
                  f"{max(r['ring_pool_bytes'] for r in res) / 2**30:.1f} GiB, device "
                  f"{max(r['ring_device_bytes'] for r in res) / 2**30:.1f} GiB", flush=True)
        row["scaling"] = row["gpus1"]["step_s"] / row[f"gpus{args.gpus}"]["step_s"]
        print(f"n={n:8d} scaling 1 -> {args.gpus} GPUs: {row['scaling']:.2f}x", flush=True)
        rows.append(row)
    if args.json:
        bench.script_results(args.json, cp, rows, gpus=args.gpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
