"""A small program for Nsight Compute: runs one cuflash kernel and FlashAttention-2's (torch SDPA
FLASH_ATTENTION) on the same problem, three times each, so that ncu can profile the last
launch of each side by side. Needs torch. The measurements in PERFORMANCE.md came from:

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
        -k regex:"^fa2_backward$|flash_bwd_dq_dk_dv" --launch-skip 4 --launch-count 2 \
        python bench/ncu_target.py bwd 128 4096 4 16
    ncu ... -k regex:"^fa2_forward$|flash_fwd" ... python bench/ncu_target.py fwd 128 512 32 16

Arguments: pass (fwd | bwd), head dim, seqlen, batch, heads, and optionally a tile shape
(forward BrxBcxWarps, backward BrxBcxWarpsxWMsdpxWMdkvxWMdqxQstages); bf16, non-causal.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy as cp  # noqa: E402
import ml_dtypes  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import cuflash  # noqa: E402
from cuflash import _api, _plan  # noqa: E402


def main(argv):
    which, d, n, b, h = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    cfg = None
    if len(argv) > 5:
        cfg = _plan.config_from_shape(
            which, d, argv[5], _plan.has_bulk_copy(int(cp.cuda.Device().compute_capability)))
    q, k, v, do = (cp.random.standard_normal((b, n, h, d), dtype=cp.float32)
                   .astype(ml_dtypes.bfloat16) for _ in range(4))
    tq, tk, tv = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16,
                              requires_grad=True) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for _ in range(3):
        if which == "fwd":
            _api._forward(q, k, v, False, None, None, None, "fa2", False, cfg)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                sdpa(tq, tk, tv)
        else:
            o, lse = cuflash.forward(q, k, v)
            _api._backward(do, q, k, v, o, lse, False, None, False, None, None, None, cfg)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                to = sdpa(tq, tk, tv)
            torch.autograd.grad(to, (tq, tk, tv), torch.randn_like(to))
    cp.cuda.Device().synchronize()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
