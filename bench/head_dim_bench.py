"""Head dims that are not a multiple of 8 (the OddD kernels: element-wise loads and stores)
against the multiple of 8 above and below them, forward and backward, in one run with kernel
timing (bench.py's median_ms: CUDA events around calls issued back to back, L2 flushed before
each). On Hopper the odd ones run on the portable kernels (TMA moves 16-byte rows), the
others on the Hopper forward.

    python bench/head_dim_bench.py                      # d 56, 59, 64, 104, 111, 112
    python bench/head_dim_bench.py --headdims 3,8 --json out.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (median_ms, no_gpu, write_results)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--headdims", default="56,59,64,104,111,112")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if bench.no_gpu("head_dim_bench"):
        return 2
    import cupy as cp
    import ml_dtypes

    import cuflash
    b, n, h = args.batch, args.seqlen, args.heads
    rows = []
    for d in (int(x) for x in args.headdims.split(",")):
        q, k, v, dout = (cp.random.standard_normal((b, n, h, d), dtype=cp.float32)
                         .astype(ml_dtypes.bfloat16) for _ in range(4))
        out, lse = cuflash.forward(q, k, v, args.causal)
        flops = 4.0 * b * h * n * n * d * (0.5 if args.causal else 1.0)
        # (bound now: the lambdas run in this iteration)
        def fwd(q=q, k=k, v=v):
            return cuflash.forward(q, k, v, args.causal)

        def bwd(dout=dout, q=q, k=k, v=v, out=out, lse=lse):
            return cuflash.backward(dout, q, k, v, out, lse, args.causal)

        for which, fn, mult in (("fwd", fwd, 1.0), ("bwd", bwd, 2.5)):
            ms = bench.median_ms(cp, fn, 2, args.reps)
            row = dict(pass_=which, headdim=d, odd=d % 8 != 0, ms=ms,
                       tflops=mult * flops / ms * 1e-9, batch=b, heads=h, seqlen=n,
                       causal=args.causal, dtype="bf16")
            rows.append(row)
            print(f"{which} d {d:3} {'OddD' if d % 8 else '    '} {ms:8.3f} ms "
                  f"{row['tflops']:6.1f} TFLOP/s", flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
