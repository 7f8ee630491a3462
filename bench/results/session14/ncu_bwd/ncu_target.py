"""ncu target: the Hopper backward (cuflash default on sm_90) and cuDNN's (torch SDPA
CUDNN_ATTENTION), bf16, d 128, n 8192, batch 2, 16 heads, non-causal, three rounds each."""
import os, sys
sys.path.insert(0, os.getcwd())
import cupy as cp, ml_dtypes, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import cuflash
d, n, b, h = (int(x) for x in (sys.argv[1:] or ["128", "8192", "2", "16"]))
causal = os.environ.get("CAUSAL") == "1"
q, k, v, do = (cp.random.standard_normal((b, n, h, d), dtype=cp.float32).astype(ml_dtypes.bfloat16) for _ in range(4))
tq, tk, tv = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
sdpa = torch.nn.functional.scaled_dot_product_attention
o, lse = cuflash.forward(q, k, v, causal=causal)
for _ in range(3):
    cuflash.backward(do, q, k, v, o, lse, causal=causal)
    cp.cuda.Device().synchronize()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        to = sdpa(tq, tk, tv, is_causal=causal)
    torch.autograd.grad(to, (tq, tk, tv), torch.randn_like(to))
    torch.cuda.synchronize()
print("done")
