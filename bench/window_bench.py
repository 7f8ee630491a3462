"""Sliding windows: time against the dense causal kernel, measured against ideal, and against
what torch offers for windows (FlexAttention with a sliding-window block mask, where it is
installed), in one run with kernel timing (bench.py's median_ms: CUDA events around calls issued
back to back, L2 flushed before each).

    python bench/window_bench.py                      # d 128, bf16, 16 heads, n 8k and 32k
    python bench/window_bench.py --seqlens 32768 --windows 4096 --json out.json

"Ideal" is the ratio of visible (query, key) pairs, window against causal: what a kernel that
skipped exactly the hidden pairs would take. The kernels skip whole blocks, so a window pays
for the blocks its edges cross.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (median_ms, gpu metadata)


def visible_pairs(n: int, left: int) -> int:
    """Query-key pairs a causal window of `left` keys before the diagonal shows (n x n);
    left < 0: the whole causal triangle."""
    rows = np.arange(n, dtype=np.int64)
    return int((np.minimum(rows, left) + 1).sum()) if left >= 0 else n * (n + 1) // 2


def flex_callables(b, h, n, d, left, dtype_name, which):
    """FlexAttention with a causal sliding window of `left` keys, compiled; None where torch or
    FlexAttention is missing."""
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    tdt = torch.bfloat16 if dtype_name == "bf16" else torch.float16

    def sliding(b_, h_, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= left)

    # (the backward is timed by calling autograd.grad on one graph again and again, which a
    # compiled graph with donated buffers refuses)
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    mask = create_block_mask(sliding, None, None, n, n, device="cuda")
    flex = torch.compile(flex_attention)
    grad = which == "bwd"
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=tdt, requires_grad=grad)
               for _ in range(3))
    if not grad:
        return lambda: flex(q, k, v, block_mask=mask)
    out = flex(q, k, v, block_mask=mask)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="8192,32768")
    ap.add_argument("--windows", default="256,1024,4096")
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--no-flex", action="store_true", help="leave FlexAttention out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    if bench.no_gpu("window_bench"):
        return 2
    import cupy as cp
    import ml_dtypes

    import cuflash
    dt = ml_dtypes.bfloat16 if args.dtype == "bf16" else np.float16
    h, d = args.heads, args.headdim
    rows = []
    for n in (int(x) for x in args.seqlens.split(",")):
        b = max(1, 32768 // n)
        q, k, v, dout = (cp.random.standard_normal((b, n, h, d), dtype=cp.float32).astype(dt)
                         for _ in range(4))
        for which in args.passes.split(","):
            dense_ms = None
            for left in [-1] + [int(x) for x in args.windows.split(",")]:
                window = (left, 0)
                if which == "fwd":
                    def fn(window=window, qkv=(q, k, v)):
                        cuflash.forward(*qkv, causal=True, window_size=window)
                else:
                    out, lse = cuflash.forward(q, k, v, causal=True, window_size=window)

                    def fn(window=window, args=(dout, q, k, v, out, lse)):
                        cuflash.backward(*args, causal=True, window_size=window)
                fn()
                ms = bench.median_ms(cp, fn, 3, args.reps)
                pairs = visible_pairs(n, left)
                row = dict(pass_=which, seqlen=n, batch=b, heads=h, headdim=d, dtype=args.dtype,
                           window=left, ms=ms, pairs=pairs, provider="cuflash")
                if left < 0:
                    dense_ms = ms
                else:
                    row["vs_dense"] = ms / dense_ms
                    row["ideal"] = pairs / visible_pairs(n, -1)
                rows.append(row)
                flex_ms = None
                if left >= 0 and not args.no_flex:
                    fx = flex_callables(b, h, n, d, left, args.dtype, which)
                    if fx is not None:
                        fx()
                        flex_ms = bench.median_ms(cp, fx, 3, args.reps)
                        rows.append(dict(row, provider="torch-flex", ms=flex_ms,
                                         vs_dense=None, ideal=None))
                print(f"{which} n {n:>6} window {'causal' if left < 0 else left:>6}: "
                      f"{ms:8.3f} ms" + (f"  {ms / dense_ms:.3f}x dense (ideal "
                                         f"{pairs / visible_pairs(n, -1):.3f})"
                                         if left >= 0 else "")
                      + (f"  FlexAttention {flex_ms:.3f} ms ({flex_ms / ms:.2f}x cuflash's "
                         "time)" if flex_ms else ""), flush=True)
        if args.json:  # after every length, so an interrupted run keeps what it measured
            bench.script_results(args.json, cp, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
