"""The Hopper backward's cost per tile, apart from its cost per row step: non-causal, seqlen_k
fixed (so the grid's tiles, K_j / V_j column blocks, stay the same), seqlen_q varied (so each
tile's row steps vary): time = waves x (fixed + steps x per step). A straight-line fit over
seqlen_q gives the fixed cost per tile (the intercept over the waves). Kernel timing.
    python bench/results/session25/bwd_fixed.py      (bf16, d 64 and 128, 1 entry)"""
import sys

import cupy as cp
import ml_dtypes
import numpy as np

sys.path.insert(0, ".")
sys.path.insert(0, "bench")
import bench  # noqa: E402
import cuflash  # noqa: E402

nk = 16384
for d in (64, 128):
    h = 2048 // d
    rows = []
    for nq in (1024, 2048, 4096, 8192, 16384):
        rng = cp.random.default_rng(0)
        q, do = (rng.standard_normal((1, nq, h, d), dtype=cp.float32).astype(ml_dtypes.bfloat16)
                 for _ in range(2))
        k, v = (rng.standard_normal((1, nk, h, d), dtype=cp.float32).astype(ml_dtypes.bfloat16)
                for _ in range(2))
        out, lse = cuflash.forward(q, k, v)
        def call(do=do, q=q, k=k, v=v, out=out, lse=lse):
            cuflash.backward(do, q, k, v, out, lse)
        ms = bench.median_ms(cp, call, 3, 15)
        rows.append((nq, ms))
        print(f"d {d} nq {nq} nk {nk} heads {h}: {ms:.4f} ms", flush=True)
    x = np.array([r[0] / 64 for r in rows], float)  # row steps per tile
    y = np.array([r[1] for r in rows], float)
    slope, icpt = np.polyfit(x, y, 1)
    tiles = h * (nk // 128)
    waves = tiles / 132
    print(f"d {d}: {slope * 1e3:.3f} us per step (all SMs, one wave), intercept {icpt * 1e3:.1f} us"
          f" over {waves:.1f} waves = {icpt * 1e3 / waves:.2f} us per tile; "
          f"fit residuals {np.round((y - (slope * x + icpt)) * 1e3, 1)} us", flush=True)
