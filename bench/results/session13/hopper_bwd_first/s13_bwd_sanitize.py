"""The Hopper backward alone, for compute-sanitizer (memcheck, racecheck): odd lengths both
ways, GQA, d 32 / 64 / 96 / 128, causal on and off."""
import cupy as cp
import ml_dtypes

import cuflash

rng = cp.random.RandomState(0)
for b, sq, sk, h, hk, d, causal in [(2, 77, 203, 4, 2, 64, False), (1, 203, 77, 4, 4, 128, True),
                                    (1, 130, 100, 6, 1, 96, True), (1, 65, 129, 2, 2, 32, False),
                                    (1, 300, 300, 2, 1, 128, False)]:
    q, dout = (rng.standard_normal((b, sq, h, d), dtype=cp.float32).astype(ml_dtypes.bfloat16)
               for _ in range(2))
    k, v = (rng.standard_normal((b, sk, hk, d), dtype=cp.float32).astype(ml_dtypes.bfloat16)
            for _ in range(2))
    out, lse = cuflash.forward(q, k, v, causal=causal)
    cuflash.backward(dout, q, k, v, out, lse, causal=causal)
    cp.cuda.Device().synchronize()
    print("done", b, sq, sk, h, hk, d, causal, flush=True)
