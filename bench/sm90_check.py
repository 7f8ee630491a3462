"""GPU: the Hopper forward (sm_90a) against the portable kernel and float64, on a few shapes.

    python bench/sm90_check.py     # prints one line per shape; exit status 1 on a mismatch

Each shape runs cuflash.forward twice: as it dispatches (the Hopper family on an H100/H200)
and under cuflash.portable_kernels(); both are compared with the float64 reference on a few
rows (max |error|), and with each other.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import ml_dtypes

    import cuflash
    from cuflash import reference
    try:
        import cupy as cp
    except ImportError:
        print("sm90_check: CuPy is not installed; nothing was run")
        return 2
    if not cp.cuda.is_available():
        print("sm90_check: no CUDA GPU visible; nothing was run")
        return 2

    rng = np.random.default_rng(0)
    shapes = [  # batch, seqlen_q, seqlen_k, heads, heads_k, d, causal, dtype
        (2, 1024, 1024, 4, 4, 128, False, "bfloat16"),
        (2, 1024, 1024, 4, 4, 128, True, "bfloat16"),
        (2, 512, 512, 4, 4, 64, False, "float16"),
        (2, 512, 512, 4, 4, 64, True, "bfloat16"),
        (1, 300, 700, 4, 2, 256, False, "bfloat16"),
        (1, 700, 300, 4, 1, 256, True, "float16"),
        (1, 333, 333, 2, 2, 96, True, "bfloat16"),
        (1, 200, 517, 6, 2, 192, False, "bfloat16"),
        (1, 129, 129, 2, 2, 8, True, "bfloat16"),
    ]
    bad = 0
    for b, sq, sk, h, hk, d, causal, dt in shapes:
        dtype = ml_dtypes.bfloat16 if dt == "bfloat16" else np.float16
        qn = rng.standard_normal((b, sq, h, d)).astype(dtype)
        kn = rng.standard_normal((b, sk, hk, d)).astype(dtype)
        vn = rng.standard_normal((b, sk, hk, d)).astype(dtype)
        q, k, v = (cp.asarray(x) for x in (qn, kn, vn))
        out, lse = cuflash.forward(q, k, v, causal=causal)
        with cuflash.portable_kernels():
            out_p, lse_p = cuflash.forward(q, k, v, causal=causal)
        cp.cuda.runtime.deviceSynchronize()
        o = cp.asnumpy(out).astype(np.float32)
        op = cp.asnumpy(out_p).astype(np.float32)
        ref_o, ref_l = reference.attention_naive(
            qn[:1].astype(np.float64), kn[:1].astype(np.float64), vn[:1].astype(np.float64),
            causal=causal)
        err = np.abs(o[:1] - ref_o).max()
        err_p = np.abs(op[:1] - ref_o).max()
        l_, lp = cp.asnumpy(lse), cp.asnumpy(lse_p)
        fin = np.isfinite(lp)
        lse_diff = np.abs(l_[fin] - lp[fin]).max() if fin.any() else 0.0
        same_inf = np.array_equal(np.isfinite(l_), fin)
        ok = np.isfinite(o).all() and err <= 2 * err_p + 1e-3 and lse_diff < 1e-2 and same_inf
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} causal={causal} {dt}: "
              f"max|err| sm90 {err:.2e}, portable {err_p:.2e}; |lse diff| {lse_diff:.1e}; "
              f"-inf rows agree {same_inf}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
