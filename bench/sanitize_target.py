"""The workload compute-sanitizer checks (bench/gpu_check.sh, step "sanitize"):

    compute-sanitizer --tool memcheck  python bench/sanitize_target.py
    compute-sanitizer --tool racecheck python bench/sanitize_target.py --small

A small grid of odd shapes through every kernel family: the FA2 forward (every head-dim
bucket), the FA1 forward, the backward (preprocess, main kernel, dQ pass) in its default,
deterministic (ordered dQ additions on sm_90) and dQ-atomics / split-slice (sm_80-89's path,
forced through its tile) modes, fp16 and bf16, causal on and off, seqlen_q above and below
seqlen_k, MHA and GQA (one part per kv head, and float32 slices per part). Prints one line per
call, so that a report can be matched to the call that caused it. --small: fewer head dims and
one dtype (racecheck tracks every shared-memory access and is much slower).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args(argv)

    import cupy as cp
    import ml_dtypes
    import numpy as np

    import cuflash
    from cuflash import _api, _plan

    dev = cp.cuda.Device().id
    dtypes = [ml_dtypes.bfloat16] if args.small else [np.float16, ml_dtypes.bfloat16]
    head_dims = [32, 64, 128, 256] if args.small else [8, 40, 64, 96, 128, 160, 192, 224, 256]
    # (batch, seqlen_q, seqlen_k, heads, kv heads): odd lengths both ways, GQA with one part
    # per kv head (enough column blocks) and with slices per part (one column block).
    shapes = [(2, 77, 203, 4, 2), (1, 203, 77, 4, 4), (1, 130, 100, 6, 1)]
    rng = cp.random.RandomState(0)
    calls = 0
    for i, d in enumerate(head_dims):
        for dtype in dtypes:
            for causal in (False, True):
                b, sq, sk, h, hk = shapes[(i + int(causal)) % len(shapes)]
                q, dout = (rng.standard_normal((b, sq, h, d), dtype=cp.float32).astype(dtype)
                           for _ in range(2))
                k, v = (rng.standard_normal((b, sk, hk, d), dtype=cp.float32).astype(dtype)
                        for _ in range(2))
                out, lse = cuflash.forward(q, k, v, causal=causal)
                for deterministic in (False, True):
                    cuflash.backward(dout, q, k, v, out, lse, causal=causal,
                                     deterministic=deterministic)
                calls += 3
                if d in (64, 128):  # FA1, and the dQ-atomics kernels (sm_80-89's path)
                    cuflash.forward(q, k, v, causal=causal, algorithm="fa1")
                    cfg = _plan.backward_config(_plan.backward_head_dim_bucket(d),
                                                _api._max_smem(cp, dev), bulk=False)
                    for deterministic in (False, True):
                        _api._backward(dout, q, k, v, out, lse, causal, None, deterministic,
                                       None, None, None, cfg)
                    calls += 3
                cp.cuda.Device().synchronize()
                print(f"d={d} {np.dtype(dtype).name} causal={causal} b={b} sq={sq} sk={sk} "
                      f"h={h} hk={hk}: ok", flush=True)
    print(f"sanitize_target: {calls} cuflash calls done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
