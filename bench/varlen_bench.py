"""Variable-length batches: cuflash.forward_varlen on a realistic mix of lengths against the
same sequences padded to the longest (cuflash's dense kernel, and cuDNN / FlashAttention-2
through torch SDPA where torch is installed), forward and backward (backward_varlen against
the padded dense backward), in one run with kernel timing (bench.py's
median_ms: CUDA events around calls issued back to back, L2 flushed before each).

    python bench/varlen_bench.py                     # d 128, 16 heads, bf16, 64k tokens
    python bench/varlen_bench.py --headdim 64 --heads 32 --json out.json

The lengths are drawn log-uniformly from 64..8192 (seeded) until they total --tokens. Reported:
tokens/s over the real tokens (the padded runs compute the padding too), and TFLOP/s over the
FLOPs each run really needs, so that varlen and the dense kernel compare at equal FLOPs (the
dense kernel's own TFLOP/s on the padded batch is its full, padded work). cuflash-dense-each:
the dense kernel on each sequence alone, one call per sequence (the sum of their times): the
same work as varlen, without the packing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (median_ms, no_gpu, script_results)


def draw_lengths(tokens: int, lo: int = 64, hi: int = 8192, seed: int = 0) -> list[int]:
    """Lengths drawn log-uniformly from lo..hi until they total `tokens` (the last one cut to
    fit, kept >= 1)."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < tokens:
        n = int(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        lengths.append(max(1, min(n, tokens - sum(lengths))))
    return lengths


def attention_flops(lengths, heads: int, d: int, causal: bool) -> float:
    """4 n^2 d per head and sequence (two matmuls), half of it under the causal mask."""
    return sum(4.0 * n * n * d * heads * (0.5 if causal else 1.0) for n in lengths)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--providers", default="torch-flash,torch-cudnn",
                    help="torch's padded runs, besides cuflash's varlen and padded ones")
    ap.add_argument("--passes", default="fwd,bwd",
                    help="fwd, bwd or both (the backward against the padded dense backward)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    if bench.no_gpu("varlen_bench"):
        return 2
    import cupy as cp
    import ml_dtypes

    import cuflash
    dt = ml_dtypes.bfloat16 if args.dtype == "bf16" else np.float16
    h, d = args.heads, args.headdim
    lengths = draw_lengths(args.tokens)
    total, longest = sum(lengths), max(lengths)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cu_dev = cp.asarray(cu)
    print(f"{len(lengths)} sequences, {total} tokens, longest {longest}, d {d}, {h} heads, "
          f"{args.dtype}", flush=True)
    q, k, v = (cp.random.standard_normal((total, h, d), dtype=cp.float32).astype(dt)
               for _ in range(3))
    pq, pk, pv = (cp.random.standard_normal((len(lengths), longest, h, d),
                                            dtype=cp.float32).astype(dt) for _ in range(3))
    rows = []
    passes = args.passes.split(",")
    for which, causal in ((w, c) for w in passes for c in (False, True)):
        mult = 2.5 if which == "bwd" else 1.0  # (the backward's five matmuls to the forward's two)
        real = mult * attention_flops(lengths, h, d, causal)
        padded = mult * attention_flops([longest] * len(lengths), h, d, causal)
        if which == "fwd":
            runs = {
                "cuflash-varlen": lambda causal=causal: cuflash.forward_varlen(
                    q, k, v, cu_dev, cu_dev, longest, longest, causal),
                "cuflash-padded": lambda causal=causal: cuflash.forward(pq, pk, pv, causal),
            }
        else:
            out, lse = cuflash.forward_varlen(q, k, v, cu_dev, cu_dev, longest, longest, causal)
            pout, plse = cuflash.forward(pq, pk, pv, causal)
            runs = {
                "cuflash-varlen": lambda causal=causal, out=out, lse=lse: cuflash.backward_varlen(
                    q, q, k, v, out, lse, cu_dev, cu_dev, longest, longest, causal),
                "cuflash-padded": lambda causal=causal, pout=pout, plse=plse: cuflash.backward(
                    pq, pq, pk, pv, pout, plse, causal),
            }
        for provider in args.providers.split(","):
            if provider.startswith("torch-"):
                point = bench.Point(cp, args.dtype, len(lengths), h, longest, d, causal, which)
                try:
                    runs.update({f"{provider}-padded": fn for fn in
                                 point.callables(provider).values()})
                except Exception as e:  # (torch missing, or the backend refuses the shape)
                    print(f"  {provider}: skipped ({type(e).__name__}: {e})", flush=True)
        timed = {}
        for name, fn in runs.items():
            fn()
            timed[name] = bench.median_ms(cp, fn, 3, args.reps)
        # The dense kernel on each sequence alone (one call each, batch 1): the same work as
        # varlen, in len(lengths) launches (the sum of their times).
        each = 0.0
        for n in lengths:
            one = [x[:n][None] for x in (q, k, v)]
            if which == "fwd":
                def call(one=one, c=causal):
                    return cuflash.forward(*one, c)
            else:
                o, lo = cuflash.forward(*one, causal)

                def call(one=one, c=causal, o=o, lo=lo):
                    return cuflash.backward(one[0], *one, o, lo, c)
            call()
            each += bench.median_ms(cp, call, 2, max(3, args.reps // 4))
        timed["cuflash-dense-each"] = each
        for name, ms in timed.items():
            flops = padded if name.endswith("-padded") else real
            row = dict(pass_=which, provider=name, causal=causal, ms=ms,
                       tokens_per_s=total / ms * 1e3,
                       tflops_real=real / ms * 1e-9, tflops_own=flops / ms * 1e-9,
                       sequences=len(lengths), tokens=total, longest=longest, headdim=d,
                       heads=h, dtype=args.dtype)
            rows.append(row)
            print(f"{which} {'causal' if causal else 'plain '} {name:22} {ms:8.3f} ms  "
                  f"{row['tokens_per_s'] / 1e6:7.2f} M tokens/s  {row['tflops_real']:6.1f} "
                  f"TFLOP/s real work ({row['tflops_own']:6.1f} its own)", flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows, lengths=lengths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
