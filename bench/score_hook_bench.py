"""Softcap and ALiBi: their cost against the plain kernel, forward and backward, in one run with
kernel timing (bench.py's median_ms: CUDA events around calls issued back to back, L2 flushed
before each).

    python bench/score_hook_bench.py                      # d 64/128, n 2k/8k, causal and not
    python bench/score_hook_bench.py --headdims 128 --seqlens 4096 --json out.json
    python bench/score_hook_bench.py --passes fwd --configs h176x2pl,h176x2ple4   # Hopper tiles

Shapes follow the standard grid (batch x seqlen = 16k tokens, heads x d = 2048). Each feature
runs the same kernel family as the plain call (the Hopper forward on an H100/H200, else the
portable one), with the score hook compiled in (score.cuh); the ratio is feature / plain time.
--configs also runs each hooked forward with the given Hopper tiles (bench.py's shapes, e.g.
`e4`: every 4th n8 tile's exponentials on the FMA pipe, which may pay where the softcap's tanh
doubles the special-function unit's work), as feature[tile], against the same plain time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (median_ms)

FEATURES = {  # name: forward()/backward() keyword arguments, given (batch, heads)
    "plain": lambda b, h: {},
    "softcap": lambda b, h: {"softcap": 30.0},
    "alibi": lambda b, h: {"alibi_slopes": 2.0 ** -np.arange(1, h + 1, dtype=np.float32)},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--configs", default="",
                    help="Hopper forward tiles to run the hooked forward with as well "
                         "(comma-separated, bench.py's hBcxStages... shapes)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    if bench.no_gpu("score_hook_bench"):
        return 2
    import cupy as cp
    import ml_dtypes

    import cuflash
    from cuflash import _api, _plan
    dt = ml_dtypes.bfloat16 if args.dtype == "bf16" else np.float16
    rows = []
    for d in (int(x) for x in args.headdims.split(",")):
        tiles = [(c, _plan.config_from_shape("fwd", d, c, False))
                 for c in filter(None, args.configs.split(","))]
        for n in (int(x) for x in args.seqlens.split(",")):
            b, h = max(1, 16384 // n), 2048 // d
            q, k, v, dout = (cp.random.standard_normal((b, n, h, d), dtype=cp.float32).astype(dt)
                             for _ in range(4))
            for causal in (False, True):
                for which in args.passes.split(","):
                    plain_ms = None
                    for name, make in FEATURES.items():
                        kw = {key: cp.asarray(x) if isinstance(x, np.ndarray) else x
                              for key, x in make(b, h).items()}
                        qkv = (q, k, v)
                        calls = []
                        if which == "fwd":
                            def fn(kw=kw, qkv=qkv, causal=causal):
                                cuflash.forward(*qkv, causal=causal, **kw)
                            calls.append((name, fn))
                            for shape, cfg in tiles if name != "plain" else ():
                                def tiled(kw=kw, qkv=qkv, causal=causal, cfg=cfg):
                                    _api._forward(*qkv, causal, None, None, None, "fa2", False,
                                                  cfg, **kw)
                                calls.append((f"{name}[{shape}]", tiled))
                        else:
                            out, lse = cuflash.forward(q, k, v, causal=causal, **kw)

                            def fn(kw=kw, args=(dout, *qkv, out, lse), causal=causal):
                                cuflash.backward(*args, causal=causal, **kw)
                            calls.append((name, fn))
                        for label, call in calls:
                            try:
                                ms = bench.median_ms(cp, call, 3, args.reps)
                            except Exception as e:  # (a tile that does not build or fit)
                                print(f"{which} d {d:>3} n {n:>5} {label}: failed "
                                      f"({type(e).__name__}: {e})"[:300], flush=True)
                                continue
                            plain_ms = plain_ms or ms
                            rows.append(dict(pass_=which, feature=label, headdim=d, seqlen=n,
                                             batch=b, heads=h, causal=causal,
                                             dtype=args.dtype, ms=ms, vs_plain=ms / plain_ms))
                            print(f"{which} d {d:>3} n {n:>5} "
                                  f"{'causal' if causal else 'plain ':6} {label:8} "
                                  f"{ms:8.3f} ms  {ms / plain_ms:.3f}x plain", flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
