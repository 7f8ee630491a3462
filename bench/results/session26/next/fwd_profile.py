"""One Hopper forward call at a standard-grid point, run three times, then cuDNN's (torch SDPA
CUDNN_ATTENTION, where torch is installed) three times, for ncu side by side:
    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats -k regex:"fa2_forward_sm90|cudnn|sm90_flash" \
        --launch-skip 2 --launch-count 2 \
        python bench/results/session26/next/fwd_profile.py 64 512 1
(args: head dim, seqlen, causal; batch x seqlen = 16k tokens, heads x d = 2048, bf16)."""
import sys

import cupy as cp
import ml_dtypes

sys.path.insert(0, ".")
import cuflash  # noqa: E402

d, n, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
b, h = 16384 // n, 2048 // d
rng = cp.random.default_rng(0)
q, k, v = (rng.standard_normal((b, n, h, d), dtype=cp.float32).astype(ml_dtypes.bfloat16)
           for _ in range(3))
for _ in range(3):
    cuflash.forward(q, k, v, causal=causal)
cp.cuda.Device().synchronize()
try:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    torch = None
if torch is not None:
    tq, tk, tv = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
        for _ in range(3):
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    torch.cuda.synchronize()
print("done", d, n, causal)
