"""The wgmma instructions the Hopper kernels use, written out once per shape.

``wgmma.mma_async`` names its accumulator registers one by one (N / 2 of them per thread for
an m64nN tile), so each shape is its own inline-asm statement. This module generates them into
``kernels/wgmma.cuh`` (``python -m cuflash.compile_check --write-params`` writes it with
params.cuh; a CPU test checks that the committed header is what this file generates):

* ``Wgmma<T, N>::ss(d, desc_a, desc_b, accumulate)``: D(64 x N) (+)= A(64 x 16) B(16 x N), A
  and B in shared memory (descriptors), both K-major: S = Q K^T.
* ``Wgmma<T, N>::rs(d, a, desc_b, accumulate)``: D (+)= A B with A in registers (four 16-bit
  pairs per thread, the mma.sync A-fragment layout) and B in shared memory, N-major
  (transposed): O~ += P~ V.
* ``Wgmma<T, N>::ss_mn(d, desc_a, desc_b, accumulate)``: D (+)= A B, both in shared memory and
  both transposed, A M-major and B N-major: the Hopper backward's dQ += dS K, whose dS is
  stored as dS^T (keys x queries) and K as TMA writes it (keys x head dim).

The accumulator ``d`` is an array ``float[N / 8][4]``: n8 tile i holds, per thread, columns
8 i + 2 (lane % 4) + {0, 1} of rows 16 (warp % 4) + lane / 4 (+ 8 for [2], [3]), the layout of
the mma.sync m16n8 accumulators that the portable kernels use.
"""

from __future__ import annotations

# The N of each instruction the kernels instantiate (B_c for S = Q K^T, the padded head dim
# for O~ += P~ V); a missing one is a compile error naming it.
SHAPES = (64, 80, 96, 112, 128, 144, 160, 176, 192, 256)
HEADER = "wgmma.cuh"
_TYPES = (("fp16", "f16"), ("bf16", "bf16"))


def _acc_operands(n: int) -> str:
    return ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(n // 2))


def _regs(first: int, count: int) -> str:
    return "{" + ", ".join(f"%{first + i}" for i in range(count)) + "}"


def _ss(tag: str, ptx: str, n: int) -> str:
    k = n // 2
    return f"""template <>
struct Wgmma<{tag}, {n}> {{
    static __device__ __forceinline__ void ss(float (&d)[{n // 8}][4], unsigned long long desc_a,
                                              unsigned long long desc_b, int accumulate) {{
        asm volatile(
            "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 2}, 0;\\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "
            "{_regs(0, k)}, %{k}, %{k + 1}, p, 1, 1, 0, 0;\\n}}"
            : {_acc_operands(n)}
            : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    }}
    static __device__ __forceinline__ void rs(float (&d)[{n // 8}][4], const unsigned (&a)[4],
                                              unsigned long long desc_b, int accumulate) {{
        asm volatile(
            "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 5}, 0;\\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "
            "{_regs(0, k)}, {_regs(k, 4)}, %{k + 4}, p, 1, 1, 1;\\n}}"
            : {_acc_operands(n)}
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    }}
    static __device__ __forceinline__ void ss_mn(float (&d)[{n // 8}][4],
                                                 unsigned long long desc_a,
                                                 unsigned long long desc_b, int accumulate) {{
        asm volatile(
            "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 2}, 0;\\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "
            "{_regs(0, k)}, %{k}, %{k + 1}, p, 1, 1, 1, 1;\\n}}"
            : {_acc_operands(n)}
            : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    }}
}};"""


def header_text() -> str:
    parts = ["// wgmma.cuh: the wgmma.mma_async shapes the Hopper kernels use (sm_90a).",
             "//",
             "// Generated from cuflash/_wgmma.py by `python -m cuflash.compile_check",
             "// --write-params`: edit that file, not this one. Wgmma<T, N>::ss computes",
             "// D (+)= A B with A (64 x 16) and B (16 x N) in shared memory, both K-major;",
             "// Wgmma<T, N>::rs computes D (+)= A B with A in registers, B N-major (transposed);",
             "// Wgmma<T, N>::ss_mn, A and B in shared memory, A M-major and B N-major.",
             "// D: float[N / 8][4], the mma.sync m16n8 accumulator layout per warp.",
             "#pragma once",
             "",
             '#include "common.cuh"',
             "",
             "namespace cuflash {",
             "",
             "template <typename T, int N>",
             "struct Wgmma;  // (no definition: an N that SHAPES in cuflash/_wgmma.py lacks)",
             "",
             "#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)"]
    for tag, ptx in _TYPES:
        for n in SHAPES:
            parts += [_ss(tag, ptx, n), ""]
    parts.append("#endif  // sm_90a")
    parts.append("")
    parts.append("}  // namespace cuflash")
    return "\n".join(parts) + "\n"
