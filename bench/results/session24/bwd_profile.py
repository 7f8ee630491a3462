"""One Hopper backward call at a standard-grid point, run twice after a forward, for ncu:
    ncu --clock-control none -k regex:fa2_backward --launch-skip 3 --launch-count 3 \
        python bench/results/session24/bwd_profile.py 128 16384 1
(args: head dim, seqlen, causal; batch x seqlen = 16k tokens, heads x d = 2048, bf16)."""
import sys

import cupy as cp
import ml_dtypes

sys.path.insert(0, ".")
import cuflash  # noqa: E402

d, n, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
b, h = 16384 // n, 2048 // d
rng = cp.random.default_rng(0)
q, k, v, do = (rng.standard_normal((b, n, h, d), dtype=cp.float32).astype(ml_dtypes.bfloat16)
               for _ in range(4))
out, lse = cuflash.forward(q, k, v, causal=causal)
for _ in range(2):
    cuflash.backward(do, q, k, v, out, lse, causal=causal)
cp.cuda.Device().synchronize()
print("done", d, n, causal)
