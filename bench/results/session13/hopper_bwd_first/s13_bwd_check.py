"""Session 13: the Hopper backward against the float64 and same-dtype naive gradients (the 3x
rule) and beside the portable backward: prints each case's errors; exits 1 on any failure.
(As run on the H200 but for formatting: two statements per line split, imports sorted.)"""
import sys
import time

import cupy as cp
import ml_dtypes
import numpy as np

sys.path.insert(0, "tests")
from gpu_helpers import assert_accurate, rand  # noqa: E402

import cuflash  # noqa: E402
from cuflash import _api, reference  # noqa: E402

DT = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}
cases = [(1, 128, 128, 1, 1, 64, "bf16", False), (1, 128, 128, 1, 1, 128, "bf16", False),
         (2, 300, 333, 4, 2, 64, "bf16", True), (2, 300, 333, 4, 2, 128, "fp16", False),
         (1, 1023, 1025, 4, 1, 128, "bf16", True), (2, 17, 203, 4, 4, 64, "fp16", True),
         (1, 203, 17, 4, 2, 128, "bf16", False), (2, 1024, 1024, 8, 8, 128, "bf16", True),
         (1, 1, 1, 2, 2, 64, "fp16", False), (2, 300, 100, 4, 4, 64, "bf16", True),
         (2, 1000, 1000, 6, 1, 96, "bf16", False), (1, 129, 65, 2, 2, 32, "fp16", True)]
taken, real = [], _api._backward_sm90
_api._backward_sm90 = lambda *a, **kw: taken.append(real(*a, **kw)) or taken[-1]
bad = 0
for b, sq, sk, h, hk, d, dt, causal in cases:
    q, dout = rand(cp, (b, sq, h, d), DT[dt]), rand(cp, (b, sq, h, d), DT[dt])
    k, v = rand(cp, (b, sk, hk, d), DT[dt]), rand(cp, (b, sk, hk, d), DT[dt])
    out, lse = cuflash.forward(q, k, v, causal=causal)
    taken.clear()
    t = time.time()
    grads = cuflash.backward(dout, q, k, v, out, lse, causal=causal)
    cp.cuda.Device().synchronize()
    with cuflash.portable_kernels():
        port = cuflash.backward(dout, q, k, v, out, lse, causal=causal)
    exact = reference.attention_backward_naive(dout, q, k, v, causal)
    naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, causal)
    line = f"b{b} sq{sq} sk{sk} h{h}/{hk} d{d} {dt} causal={causal} sm90={taken}:"
    for name, ours, po, nv, ex in zip(("dq", "dk", "dv"), grads, port, naive, exact):
        e = float(cp.abs(ours.astype(cp.float64) - ex).max())
        ep = float(cp.abs(po.astype(cp.float64) - ex).max())
        en = float(cp.abs(nv.astype(cp.float64) - ex).max())
        line += f" {name} {e:.2e} (portable {ep:.2e}, naive {en:.2e})"
        try:
            assert_accurate(cp, ours, nv, ex, 3.0, name)
        except AssertionError as exc:
            bad += 1
            line += f" FAIL[{str(exc)[:200]}]"
    print(line, flush=True)
print("failures:", bad)
sys.exit(1 if bad else 0)
