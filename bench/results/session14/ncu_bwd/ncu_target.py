"""ncu target of session 14 (.diag/s14callC.sh): the Hopper backward (cuflash's default on sm_90)
and cuDNN's (torch SDPA CUDNN_ATTENTION), bf16, d 128, n 8192, batch 2, 16 heads, non-causal,
three rounds each. Run from the repository root:

    ncu --clock-control none -k regex:"fa2_backward_sm90|bprop" --launch-skip 2 \
        --launch-count 2 --section SourceCounters ... python3 ncu_target.py
"""

import os
import sys

sys.path.insert(0, os.getcwd())

import cupy as cp  # noqa: E402
import ml_dtypes  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import cuflash  # noqa: E402

d, n, b, h = (int(x) for x in (sys.argv[1:] or ["128", "8192", "2", "16"]))
causal = os.environ.get("CAUSAL") == "1"
q, k, v, do = (cp.random.standard_normal((b, n, h, d), dtype=cp.float32)
               .astype(ml_dtypes.bfloat16) for _ in range(4))
tq, tk, tv = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for _ in range(3))
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
