"""How often FlashAttention-2's accuracy rule (max error <= 2 x the same-dtype naive
attention's + 1e-5) fails a correct FlashAttention computation, by problem size: a NumPy
emulation of the kernels' arithmetic (bf16 inputs, fp32 S and softmax, P~ rounded to bf16
before P~ V, O normalised at the end and rounded to bf16), with the key blocks of a given
tiling, against float64, over many random draws.

    python bench/rule_noise.py

With one query row and d 8 (8 output elements) the max error is the final rounding of a
single element, and the rule fails a few percent of draws for any tiling; with 64 rows x d 8
(512 elements) it still fails now and then; from 4096 output elements (512 rows x d 8, 64 rows
x d 64) it does not fail. tests/test_fuzz_gpu.py repeats small examples up to that size.
(PERFORMANCE.md, 2026-11-30, the Hopper forward.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np


def bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def rule_holds(seed: int, sq: int, sk: int, d: int, blocks: tuple) -> bool:
    rng = np.random.default_rng(seed)
    q, k, v = (bf16(rng.standard_normal(s).astype(np.float32))
               for s in ((sq, d), (sk, d), (sk, d)))
    scale = d ** -0.5
    # float64 reference
    S64 = q.astype(np.float64) @ k.T.astype(np.float64) * scale
    P64 = np.exp(S64 - S64.max(1, keepdims=True))
    ref = (P64 / P64.sum(1, keepdims=True)) @ v.astype(np.float64)
    # naive attention in the same dtype: P = softmax(S) in fp32, cast to bf16, P V
    S = (q @ k.T).astype(np.float32) * np.float32(scale)
    P = np.exp(S - S.max(1, keepdims=True))
    naive = bf16(bf16(P / P.sum(1, keepdims=True)) @ v)
    # FlashAttention: key blocks, online softmax, P~ rounded, O~ / l at the end
    S = (q @ k.T).astype(np.float32)
    scale_log2 = np.float32(scale * np.log2(np.e))
    m = np.full((sq, 1), -np.inf, np.float32)
    l = np.zeros((sq, 1), np.float32)
    O = np.zeros((sq, d), np.float32)
    c0 = 0
    for b in blocks:
        S_j = S[:, c0:c0 + b]
        m_new = np.maximum(m, S_j.max(1, keepdims=True))
        alpha = np.exp2(m * scale_log2 - m_new * scale_log2)
        P_j = np.exp2(S_j * scale_log2 - m_new * scale_log2).astype(np.float32)
        l = alpha * l + P_j.sum(1, keepdims=True)
        O = alpha * O + bf16(P_j) @ v[c0:c0 + b]
        m, c0 = m_new, c0 + b
    ours = bf16(O / l)
    return np.abs(ours - ref).max() <= 2 * np.abs(naive - ref).max() + 1e-5


def main() -> None:
    for sq, sk, d, draws in ((1, 94, 8, 20000), (64, 94, 8, 3000), (512, 94, 8, 2000),
                            (64, 94, 64, 2000)):
        for blocks in ((94,), (64, 30)):
            fails = sum(not rule_holds(s, sq, sk, d, blocks) for s in range(draws))
            print(f"{sq} query rows x {sk} keys, d {d}, key blocks {blocks}: the rule fails "
                  f"{fails / draws:.2%} of {draws} draws")


if __name__ == "__main__":
    main()
