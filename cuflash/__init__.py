"""cuflash: FlashAttention for CuPy, with CUDA kernels compiled at run time by NVRTC.

    out, lse = cuflash.forward(q, k, v, causal=True)
    dq, dk, dv = cuflash.backward(dout, q, k, v, out, lse, causal=True)

See README.md for shapes, dtypes and the algorithms; ``cuflash.reference`` holds the NumPy
(float64) reference implementations the GPU kernels are tested against.
"""

from ._api import (
    attention_with_vjp,
    backward,
    backward_varlen,
    forward,
    forward_varlen,
    portable_kernels,
    precompile,
)
from ._kvcache import forward_kvcache
from ._loader import KernelCompileError
from ._version import __version__

__all__ = ["forward", "forward_varlen", "backward", "backward_varlen", "attention_with_vjp",
           "forward_kvcache", "precompile", "portable_kernels", "KernelCompileError",
           "__version__"]
