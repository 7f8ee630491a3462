"""Run cuflash's main job on a default example:

    python -m cuflash.demo                     # bf16, batch 2, seqlen 4096, 16 heads, d 128, causal
    python -m cuflash.demo --dtype fp16 --seqlen 1024 --no-causal

Compiles the kernel (with a message), checks the output against float64 attention by the
accuracy rule (at most 2x the error of a naive attention in the same dtype), then prints the
median time and TFLOP/s. Exits 2 when no usable GPU is present, 1 when the check fails.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="cuflash forward on a default example")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)

    from cuflash._api import gpu_missing
    if gpu_missing():
        print(f"cuflash demo: {gpu_missing()}. Nothing was run.", file=sys.stderr)
        return 2
    import cupy as cp
    import ml_dtypes
    import numpy as np

    import cuflash
    from cuflash import _api, _plan, reference

    dtype = ml_dtypes.bfloat16 if args.dtype == "bf16" else np.float16
    b, n, h, d = args.batch, args.seqlen, args.heads, args.headdim
    dev = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    print(f"device: {name} (sm_{dev.compute_capability})")
    print(f"problem: {args.dtype}, batch {b}, seqlen {n}, heads {h}, headdim {d}, "
          f"causal={args.causal}")

    q, k, v = ((cp.random.standard_normal((b, n, h, d), dtype=cp.float32)).astype(dtype)
               for _ in range(3))
    cfg = _plan.forward_config(_plan.head_dim_bucket(d), args.causal,
                               _api._max_smem(cp, dev.id))
    kname = _plan.forward_kernel_name(np.dtype(dtype).name, cfg, args.causal)
    print(f"compiling {kname} (NVRTC, or CuPy's disk cache) ...", end=" ",
          flush=True)
    t0 = time.perf_counter()
    out, lse = cuflash.forward(q, k, v, causal=args.causal)
    cp.cuda.Device().synchronize()
    print(f"done in {time.perf_counter() - t0:.1f} s")

    # Check on (at most) the first batch entry and 4 heads: float64 attention is big.
    hs = min(h, 4)
    sub = (slice(0, 1), slice(None), slice(0, hs))
    O_ref, L_ref = reference.attention_naive(q[sub], k[sub], v[sub], args.causal)
    naive = reference.attention_naive_same_dtype(q[sub], k[sub], v[sub], args.causal)
    err = float(cp.abs(out[sub].astype(cp.float64) - O_ref).max())
    naive_err = float(cp.abs(naive.astype(cp.float64) - O_ref).max())
    lse_err = float(cp.abs(lse[0, :hs].astype(cp.float64) - L_ref[0]).max())
    ok = bool(cp.isfinite(out.astype(cp.float32)).all()) and err <= 2 * naive_err + 1e-5 \
        and lse_err <= 1e-3
    print(f"check vs float64 attention (batch 0, heads 0..{hs - 1}): max error {err:.2e}, "
          f"naive {args.dtype} attention {naive_err:.2e}, lse error {lse_err:.1e}: "
          f"{'OK' if ok else 'FAILED'}")

    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(args.reps + 3):
        start.record()
        cuflash.forward(q, k, v, causal=args.causal)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    ms = float(np.median(times[3:]))
    flops = 4 * b * h * n * n * d / (2 if args.causal else 1)
    print(f"forward: {ms:.3f} ms median of {args.reps}, {flops / ms / 1e9:.1f} TFLOP/s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
