"""NumPy reference implementations (CPU, float64), named as in the seed document.

* :func:`attention_naive`: the standard attention of section 2.2, S = scale Q K^T,
  P = softmax(S), O = P V, materialising the N x N matrices. The ground truth.
* :func:`attention_naive_same_dtype`: the same, written the way a user would in fp16/bf16
  (the yardstick of the accuracy rule: cuflash may err at most 2x as much as this).
* :func:`attention_fa2_tiled`: the FlashAttention-2 forward loop (section 2.4.1.1) exactly as
  ``kernels/fa2_forward.cu`` runs it: row blocks of B_r, column blocks of B_c visited as
  :func:`column_blocks` says, running m and l, unscaled O~, final diag(l)^-1 and
  L = m + log l, element masks only on the blocks the kernel masks.

Layouts follow the API: q (batch, seqlen_q, nheads, d); k, v (batch, seqlen_k, nheads_k, d);
returned O like q and L (batch, nheads, seqlen_q). Causal masks are aligned bottom-right:
query i sees key j iff j <= i + seqlen_k - seqlen_q. Rows that see no key: O = 0, L = -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["attention_naive", "attention_naive_same_dtype", "attention_fa2_tiled", "column_blocks", "visible_limit",
           "causal_mask", "ColumnBlocks"]


def _xp(x):
    """numpy, or cupy for CuPy arrays (so the GPU tests can run the float64 reference on the
    GPU); cuflash itself never needs this."""
    if type(x).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def _heads_to_front(x, nheads):
    """(b, s, h_k, d) float64 -> (b, nheads, s, d), repeating each kv head for its group."""
    xp = _xp(x)
    x = xp.asarray(x).astype(xp.float64).transpose(0, 2, 1, 3)
    group = nheads // x.shape[1]
    return xp.repeat(x, group, axis=1) if group > 1 else x


def visible_limit(row, seqlen_q, seqlen_k, causal):
    """The last key column query `row` may see (< 0: none). Mirrors block_range.cuh."""
    limit = seqlen_k - 1
    if causal:
        limit = np.minimum(limit, row + seqlen_k - seqlen_q)
    return limit


def causal_mask(seqlen_q, seqlen_k, causal, xp=np):
    """Boolean (seqlen_q, seqlen_k): True where key j is visible from query i."""
    rows = xp.arange(seqlen_q)[:, None]
    cols = xp.arange(seqlen_k)[None, :]
    return xp.broadcast_to(cols <= visible_limit(rows, seqlen_q, seqlen_k, causal),
                           (seqlen_q, seqlen_k))


def attention_naive(q, k, v, causal=False, softmax_scale=None):
    """Standard attention in float64 (NumPy, or CuPy for CuPy inputs). Returns (O, L)."""
    xp = _xp(q)
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    Q, K, V = (_heads_to_front(x, nheads) for x in (q, k, v))
    S = scale * (Q @ K.transpose(0, 1, 3, 2))                     # S = scale Q K^T
    S = xp.where(causal_mask(seqlen_q, seqlen_k, causal, xp), S, -xp.inf)
    if seqlen_k:
        m = S.max(axis=-1, keepdims=True)                         # m = rowmax(S)
    else:
        m = xp.full(S.shape[:-1] + (1,), -xp.inf)
    m_safe = xp.where(xp.isfinite(m), m, 0.0)
    E = xp.exp(S - m_safe)                                        # e^(S - m), 0 where masked
    l = E.sum(axis=-1, keepdims=True)                             # l = rowsum(e^(S - m))
    has_keys = l > 0
    P = E / xp.where(has_keys, l, 1.0)                            # P = softmax(S); 0 if no key
    O = P @ V                                                     # O = P V
    L = xp.where(has_keys, m_safe + xp.log(xp.where(has_keys, l, 1.0)), -xp.inf)[..., 0]
    return O.transpose(0, 2, 1, 3), L


def attention_naive_same_dtype(q, k, v, causal=False, softmax_scale=None):
    """Standard attention in the inputs' dtype (fp16/bf16), NumPy or CuPy: both matmuls with
    16-bit operands and fp32 accumulation, S rounded to the dtype, softmax in fp32, P cast back
    to the dtype, O rounded to the dtype. Returns O only."""
    xp = _xp(q)
    dt = q.dtype
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)

    def heads_first(x):
        x = x.astype(xp.float32).transpose(0, 2, 1, 3)
        return xp.repeat(x, nheads // x.shape[1], axis=1) if x.shape[1] != nheads else x

    Q, K, V = heads_first(q), heads_first(k), heads_first(v)
    S = (Q @ K.transpose(0, 1, 3, 2)).astype(dt).astype(xp.float32) * xp.float32(scale)
    S = xp.where(causal_mask(seqlen_q, seqlen_k, causal, xp), S, -xp.inf)
    if seqlen_k:
        m = S.max(axis=-1, keepdims=True)
    else:
        m = xp.zeros(S.shape[:-1] + (1,), xp.float32)
    E = xp.exp(S - xp.where(xp.isfinite(m), m, 0))
    l = E.sum(axis=-1, keepdims=True)
    P = (E / xp.where(l > 0, l, 1)).astype(dt).astype(xp.float32)
    return (P @ V).astype(dt).transpose(0, 2, 1, 3)


@dataclass(frozen=True)
class ColumnBlocks:
    begin: int          # first column block visited
    masked_begin: int   # [begin, masked_begin): no element mask; [masked_begin, end): masked
    end: int            # one past the last column block visited


def column_blocks(row_block, B_r, B_c, seqlen_q, seqlen_k, causal) -> ColumnBlocks:
    """Which column blocks row block `row_block` visits. Mirrors block_range.cuh line by line."""
    first_row = row_block * B_r
    last_row = min(first_row + B_r, seqlen_q) - 1
    last_any = int(visible_limit(last_row, seqlen_q, seqlen_k, causal))
    last_all = int(visible_limit(first_row, seqlen_q, seqlen_k, causal))
    begin = 0
    end = 0 if last_any < 0 else last_any // B_c + 1
    masked_begin = 0 if last_all + 1 < 0 else (last_all + 1) // B_c
    masked_begin = max(begin, min(masked_begin, end))
    return ColumnBlocks(begin, masked_begin, end)


def attention_fa2_tiled(q, k, v, causal=False, softmax_scale=None, B_r=64, B_c=64):
    """The FA2 forward loop, in float64, block by block. Returns (O, L).

    Also checks the block plan against the mask: blocks it skips must be fully masked and
    blocks it leaves unmasked must be fully visible (AssertionError otherwise).
    """
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    Q, K, V = (_heads_to_front(x, nheads) for x in (q, k, v))
    visible = causal_mask(seqlen_q, seqlen_k, causal)
    O = np.zeros((batch, nheads, seqlen_q, d))
    L = np.zeros((batch, nheads, seqlen_q))
    T_r = -(-seqlen_q // B_r)
    T_c = -(-seqlen_k // B_c)
    for i in range(T_r):                                   # one thread block per row block
        rows = slice(i * B_r, min((i + 1) * B_r, seqlen_q))
        Q_i = Q[:, :, rows]                                # (b, h, B_r, d)
        m_i = np.full(Q_i.shape[:-1], -np.inf)             # running rowmax of S (unscaled)
        l_i = np.zeros(Q_i.shape[:-1])                     # running rowsum of P~
        O_i = np.zeros(Q_i.shape)                          # O~_i, unscaled
        cb = column_blocks(i, B_r, B_c, seqlen_q, seqlen_k, causal)
        for j in range(T_c):
            cols = slice(j * B_c, min((j + 1) * B_c, seqlen_k))
            block_visible = visible[rows, cols]
            if not cb.begin <= j < cb.end:
                assert not block_visible.any(), f"skipped block ({i}, {j}) has visible keys"
                continue
            if j < cb.masked_begin:
                assert block_visible.all(), f"unmasked block ({i}, {j}) has masked keys"
            S_ij = Q_i @ K[:, :, cols].transpose(0, 1, 3, 2)          # S_ij = Q_i K_j^T
            if j >= cb.masked_begin:
                S_ij = np.where(block_visible, S_ij, -np.inf)
            m_new = np.maximum(m_i, S_ij.max(axis=-1))                # m_new = max(m, rowmax S)
            m_scaled = np.where(np.isneginf(m_new), 0.0, m_new * scale)
            P_ij = np.exp(S_ij * scale - m_scaled[..., None])         # P~ = e^(scale S - m)
            alpha = np.exp(m_i * scale - m_scaled)                    # e^(m_old - m_new)
            l_i = alpha * l_i + P_ij.sum(axis=-1)                     # l = e^(..) l + rowsum P~
            O_i = alpha[..., None] * O_i + P_ij @ V[:, :, cols]       # O~ = diag(..) O~ + P~ V_j
            m_i = m_new
        inv_l = np.divide(1.0, l_i, out=np.zeros_like(l_i), where=l_i > 0)
        O[:, :, rows] = inv_l[..., None] * O_i                         # O_i = diag(l)^-1 O~_i
        with np.errstate(divide="ignore"):
            L[:, :, rows] = np.where(l_i > 0, m_i * scale + np.log(l_i), -np.inf)  # L = m + log l
    return O.transpose(0, 2, 1, 3), L
