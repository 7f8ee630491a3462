"""NumPy reference implementations (CPU, float64), named as in the seed document.

* :func:`attention_naive`: the standard attention of section 2.2, S = scale Q K^T,
  P = softmax(S), O = P V, materialising the N x N matrices. The ground truth.
* :func:`attention_naive_same_dtype`: the same, written the way a user would in fp16/bf16
  (the yardstick of the accuracy rule: cuflash may err at most 2x as much as this).
* :func:`attention_backward_naive` (float64), :func:`attention_backward_naive_same_dtype`
  (the yardstick for gradients) and :func:`attention_backward_fa2_tiled`: the recompute
  backward of section 2.4.1.2 block by block, as ``kernels/fa2_backward.cu`` runs it.
* :func:`attention_fa1_tiled`: FlashAttention-1's Algorithm 1 as ``kernels/fa1_forward.cu``
  runs it: K/V column blocks outside, Q row blocks inside, O, l, m read and written back at
  every inner step with the seed's rescaling.
* :func:`attention_fa2_tiled`: the FlashAttention-2 forward loop (section 2.4.1.1) exactly as
  ``kernels/fa2_forward.cu`` runs it: row blocks of B_r, column blocks of B_c visited as
  :func:`column_blocks` says, running m and l, unscaled O~, final diag(l)^-1 and
  L = m + log l, element masks only on the blocks the kernel masks.

Layouts follow the API: q (batch, seqlen_q, nheads, d); k, v (batch, seqlen_k, nheads_k, d);
returned O like q and L (batch, nheads, seqlen_q). Causal masks are aligned bottom-right:
query i sees key j iff j <= i + seqlen_k - seqlen_q. Rows that see no key: O = 0, L = -inf.

The training features (FlashAttention-2's names and conventions), keyword arguments of the
forward and backward functions:

* ``window_size=(left, right)``: query i sees key j iff i + seqlen_k - seqlen_q - left <= j
  <= i + seqlen_k - seqlen_q + right; -1 leaves that side unbounded; causal is right = 0.
* ``softcap``: S -> softcap tanh(S / softcap) on the scaled scores S = scale Q K^T (0: off).
* ``alibi_slopes`` (nheads,) or (batch, nheads): S -> S - slope |i + seqlen_k - seqlen_q - j|,
  after the softcap.
* Variable length: :func:`attention_naive_varlen` and :func:`attention_backward_naive_varlen`
  on packed (total_tokens, heads, d) arrays with cumulative sequence lengths.

KV-cache decoding: :func:`attention_kvcache_naive` (the ground truth: append, then attend to
each entry's cached keys, contiguous or paged through a block table) and
:func:`attention_kvcache_split` (the split-KV decode as the kernels run it: query heads packed
by KV head, the key range split into :func:`kvcache_splits`, partial O and L combined exactly).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["attention_naive", "attention_naive_same_dtype", "attention_fa2_tiled",
           "attention_backward_naive", "attention_backward_naive_same_dtype",
           "attention_backward_fa2_tiled", "attention_fa1_tiled", "SeqInfo", "seq_info",
           "Mask", "row_blocks", "block_needs_mask", "column_blocks", "causal_mask",
           "ColumnBlocks", "Score", "attention_naive_varlen", "attention_backward_naive_varlen",
           "check_cu_seqlens", "attention_kvcache_naive", "attention_kvcache_split",
           "kvcache_append", "kvcache_splits", "num_splits_for", "cache_rows", "check_kvcache",
           "cache_capacity"]


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


# ---------------------------------------------------------------------------------------------
# The pieces the kernels are built from, mirrored: sequence info (seqinfo.cuh), the mask
# (mask.cuh) and the block ranges (block_range.cuh). A new mask is modelled and tested here
# first.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SeqInfo:
    """Where one batch entry's rows are (mirrors kernels/seqinfo.cuh). Dense (start_q < 0):
    every entry has seqlen_q query rows and seqlen_k key rows at batch * stride_b. Packed
    (variable length, PackedSeq): the entries lie back to back, this one from row start_q of
    the packed query tensor and start_k of the key tensor, and L is (heads, total_q)."""
    batch: int
    seqlen_q: int
    seqlen_k: int
    start_q: int = -1
    start_k: int = -1
    total_q: int = 0

    @property
    def packed(self) -> bool:
        return self.start_q >= 0

    def q_offset(self, stride_b: int, stride_s: int) -> int:
        return self.start_q * stride_s if self.packed else self.batch * stride_b

    def k_offset(self, stride_b: int, stride_s: int) -> int:
        return self.start_k * stride_s if self.packed else self.batch * stride_b

    def row_vector(self, head: int, nheads: int) -> int:
        """Offset of (entry, head, row 0) in a row vector (L, D): (batch, heads, seqlen_q), or
        packed (heads, total_q)."""
        if self.packed:
            return head * self.total_q + self.start_q
        return (self.batch * nheads + head) * self.seqlen_q


def seq_info(batch: int, seqlen_q: int, seqlen_k: int) -> SeqInfo:
    """DenseSeq::info."""
    return SeqInfo(batch, seqlen_q, seqlen_k)


def packed_seq_info(batch: int, cu_seqlens_q, cu_seqlens_k, total_q: int) -> SeqInfo:
    """PackedSeq::info: entry `batch` of a variable-length batch."""
    q0, k0 = int(cu_seqlens_q[batch]), int(cu_seqlens_k[batch])
    return SeqInfo(batch, int(cu_seqlens_q[batch + 1]) - q0, int(cu_seqlens_k[batch + 1]) - k0,
                   q0, k0, total_q)


class PackedUnits:
    """Mirrors kernels/seqinfo.cuh's PackedUnits: a packed batch's row blocks of B_r rows
    numbered without gaps, entry by entry, an entry's heads one after the other, a head's row
    blocks in order (the Hopper forward's tile scheduler hands these numbers out in
    increasing order). The walk only moves on: find(u) must see increasing u."""

    def __init__(self, cu_seqlens_q, nheads: int, B_r: int):
        self.cu, self.nheads, self.B_r = [int(x) for x in cu_seqlens_q], nheads, B_r
        self.entry = self.first = self.T_r = 0

    def find(self, u: int):
        """(entry, head, row block) of unit u, or None past the last unit."""
        while self.entry < len(self.cu) - 1:
            n = self.cu[self.entry + 1] - self.cu[self.entry]
            self.T_r = (n + self.B_r - 1) // self.B_r
            if u < self.first + self.T_r * self.nheads:
                return (self.entry, (u - self.first) // self.T_r, (u - self.first) % self.T_r)
            self.first += self.T_r * self.nheads
            self.entry += 1
        self.T_r = 0
        return None


@dataclass(frozen=True)
class Mask:
    """Which keys each query row sees (mirrors kernels/mask.cuh): keys(row) = [lo, hi].
    Masks are aligned bottom-right (row i's diagonal is key i + seqlen_k - seqlen_q): a sliding
    window (window_left, window_right; -1 unbounded) keeps the keys from left before the
    diagonal to right after it, and causal is window_right = 0. A row can see nothing (when
    seqlen_q > seqlen_k with the causal mask, or at the edges of a window): O = 0, L = -inf."""
    seqlen_q: int
    seqlen_k: int
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    diag_shift: int = 0  # row i's diagonal is key i + seqlen_k - seqlen_q + diag_shift

    @property
    def right(self) -> int:
        """The upper limit's distance from the diagonal (-1: none); causal is 0."""
        if self.causal:
            return 0 if self.window_right < 0 else min(self.window_right, 0)
        return self.window_right

    @property
    def left_of_diagonal(self) -> bool:
        """No row sees a key right of its diagonal, as the kernels take it
        (kernels/mask.cuh's LEFT_OF_DIAGONAL): the causal mask without a window. (A window
        whose right side is 0 has the property too; the kernels leave it out.)"""
        return self.causal and not self.LOCAL

    @property
    def LOCAL(self) -> bool:
        """A lower key limit (a window's left side): blocks left of it are skipped too."""
        return self.window_left >= 0

    @property
    def offset(self) -> int:
        """Row i's diagonal is key i + offset."""
        return self.seqlen_k - self.seqlen_q + self.diag_shift

    def keys(self, row):
        """(lo, hi) of query row(s) `row` (NumPy arrays broadcast); none when hi < lo."""
        diag = np.asarray(row) + self.offset
        hi = np.full(np.shape(row), self.seqlen_k - 1)
        if self.right >= 0:
            hi = np.minimum(hi, diag + self.right)
        lo = np.zeros(np.shape(row), dtype=int)
        if self.LOCAL:
            lo = np.maximum(lo, diag - self.window_left)
        return (lo, hi) if np.ndim(row) else (int(lo), int(hi))

    def first_row(self, col_lo: int) -> int:
        """The first query row that sees a key in [col_lo, ...] (the upper limit cuts rows
        above it)."""
        if self.right < 0:
            return 0
        return max(0, col_lo - self.offset - self.right)

    def last_row(self, col_hi: int) -> int:
        """The last query row that sees a key in [..., col_hi] (a lower limit cuts rows below;
        negative when none does)."""
        if not self.LOCAL:
            return self.seqlen_q - 1
        return min(self.seqlen_q - 1, col_hi - self.offset + self.window_left)

    def visible(self, xp=np):
        """Boolean (seqlen_q, seqlen_k): True where key j is visible from query i."""
        rows = np.arange(self.seqlen_q)
        lo, hi = self.keys(rows)
        cols = np.arange(self.seqlen_k)[None, :]
        return xp.asarray((cols >= lo[:, None]) & (cols <= hi[:, None]))


def causal_mask(seqlen_q, seqlen_k, causal, xp=np, window_size=(-1, -1)):
    """Boolean (seqlen_q, seqlen_k): True where key j is visible from query i."""
    return Mask(seqlen_q, seqlen_k, causal, *window_size).visible(xp)


@dataclass(frozen=True)
class Score:
    """The score hook (mirrors kernels/score.cuh): what S_ij = Q_i K_j^T becomes before the
    softmax, as FlashAttention-2 defines it: S = scale Q K^T; then S = softcap tanh(S /
    softcap) where softcap > 0; then S = S - slope |i + seqlen_k - seqlen_q - j| where ALiBi
    slopes are given ((nheads,) or (batch, nheads), per query head), the diagonal moved by
    diag_shift keys as the Mask's."""
    scale: float
    softcap: float = 0.0
    alibi_slopes: object = None
    diag_shift: int = 0

    def apply(self, xp, S_raw, rows, cols, seqlen_q: int, seqlen_k: int):
        """The hooked scores of S_raw = Q K^T, shaped (batch, heads, len(rows), len(cols)), for
        query rows `rows` and key columns `cols` (integer arrays) of a seqlen_q x seqlen_k
        problem."""
        S = S_raw * self.scale
        if self.softcap > 0:
            S = self.softcap * xp.tanh(S / self.softcap)
        if self.alibi_slopes is not None:
            slopes, diag, cols = self._alibi(xp, S.dtype, rows, cols, seqlen_q, seqlen_k)
            S = S - slopes * xp.abs(diag - cols[None, :]).astype(S.dtype)
        return S

    def _alibi(self, xp, dtype, rows, cols, seqlen_q: int, seqlen_k: int):
        """ALiBi's pieces: the slopes shaped to broadcast over (batch, heads, rows, cols), each
        row's diagonal key (len(rows), 1) and the columns as an array."""
        slopes = xp.asarray(self.alibi_slopes).astype(dtype)
        slopes = slopes[None, :, None, None] if slopes.ndim == 1 else slopes[:, :, None, None]
        diag = xp.asarray(rows)[:, None] + (seqlen_k - seqlen_q + self.diag_shift)
        return slopes, diag, xp.asarray(cols)

    def apply_split(self, xp, S_raw, rows, cols, seqlen_q: int, seqlen_k: int,
                    left_of_diagonal: bool):
        """(S', row_bias) with apply()'s S = S' + row_bias, as the forward kernels split it
        (kernels/score.cuh; they split outside the causal mask at d 64 only, the identity is
        the same at every head dim): where the block lies left of every row's diagonal
        (always where no row sees a key right of it: hidden keys are masked after), ALiBi's
        -slope |i + seqlen_k - seqlen_q - j| is -slope (i + seqlen_k - seqlen_q - j0) for the
        row (row_bias, (..., len(rows), 1)) plus slope (j - j0) for the element, j0 = cols[0];
        right of it, the same terms negated (the softmax adds row_bias to the row max and to
        the exponent). A block crossing the diagonal keeps S' = S and row_bias = 0, as do
        calls without ALiBi. (The kernels decide per warp's rows; here per block.)"""
        if self.alibi_slopes is None:
            return self.apply(xp, S_raw, rows, cols, seqlen_q, seqlen_k), 0.0
        slopes, diag, cols = self._alibi(xp, S_raw.dtype, rows, cols, seqlen_q, seqlen_k)
        dist = diag - cols[None, :]
        if left_of_diagonal or bool((dist >= 0).all()):
            side = 1.0
        elif bool((dist <= 0).all()):
            side = -1.0
        else:
            return self.apply(xp, S_raw, rows, cols, seqlen_q, seqlen_k), 0.0
        plain = Score(self.scale, self.softcap, diag_shift=self.diag_shift)
        S = plain.apply(xp, S_raw, rows, cols, seqlen_q, seqlen_k)
        j0 = cols[0]
        row_bias = -side * slopes * (diag - j0).astype(S.dtype)
        return S + side * slopes * (cols[None, :] - j0).astype(S.dtype), row_bias

    def grad(self, xp, S_raw, dS):
        """The gradient with respect to scale S_raw (the scaled scores before the softcap),
        given dS with respect to the hooked scores: dS itself, times 1 - tanh^2 with the
        softcap (ALiBi's bias has none). The gradient with respect to S_raw = Q K^T is scale
        times this; the backward applies the scale after its matmuls, as the kernels do."""
        if self.softcap > 0:
            t = xp.tanh(S_raw * self.scale / self.softcap)
            return dS * (1 - t * t)
        return dS


def _features(d, softmax_scale, causal, seqlen_q, seqlen_k, window_size, softcap,
              alibi_slopes, diag_shift=0):
    """(Mask, Score) of a call's arguments. diag_shift: row i's diagonal is key i + seqlen_k -
    seqlen_q + diag_shift (ring attention's blocks: cuflash.distributed)."""
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    left, right = window_size
    return (Mask(seqlen_q, seqlen_k, causal, int(left), int(right), int(diag_shift)),
            Score(scale, float(softcap), alibi_slopes, int(diag_shift)))


def _hooked_scores(xp, Q, K, mask: Mask, score: Score, round_to=None):
    """(S_raw, S): Q K^T (rounded to `round_to` if given, then float32) and the hooked,
    masked scores (-inf where hidden)."""
    S_raw = Q @ K.transpose(0, 1, 3, 2)
    if round_to is not None:
        S_raw = S_raw.astype(round_to).astype(xp.float32)
    rows, cols = np.arange(mask.seqlen_q), np.arange(mask.seqlen_k)
    S = score.apply(xp, S_raw, rows, cols, mask.seqlen_q, mask.seqlen_k)
    if round_to is not None:
        S = S.astype(xp.float32)
    return S_raw, xp.where(mask.visible(xp), S, -xp.inf)


def _softmax_rows(xp, S):
    """(P, m, l) of masked scores S: P = softmax(S) per row (0 for a row with no key), m the
    row max (0 where it is -inf), l the row sum of e^(S - m)."""
    if S.shape[-1]:
        m = S.max(axis=-1, keepdims=True)
    else:
        m = xp.full(S.shape[:-1] + (1,), -xp.inf, S.dtype)
    m = xp.where(xp.isfinite(m), m, 0.0).astype(S.dtype)
    E = xp.exp(S - m)                                             # e^(S - m), 0 where masked
    l = E.sum(axis=-1, keepdims=True)                             # l = rowsum(e^(S - m))
    return E / xp.where(l != 0, l, 1), m, l                       # P = softmax(S); 0 if no key


def _log_sum_exp(xp, m, l):
    """L = m + log(l) per row, -inf for a row that saw no key (l = 0); NaN stays NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return xp.where(l != 0, m + xp.log(xp.where(l != 0, l, 1.0)), -xp.inf)


def attention_naive(q, k, v, causal=False, softmax_scale=None, *, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, diag_shift=0):
    """Standard attention in float64 (NumPy, or CuPy for CuPy inputs). Returns (O, L)."""
    xp = _xp(q)
    batch, seqlen_q, nheads, d = q.shape
    mask, score = _features(d, softmax_scale, causal, seqlen_q, k.shape[1], window_size,
                            softcap, alibi_slopes, diag_shift)
    Q, K, V = (_heads_to_front(x, nheads) for x in (q, k, v))
    _, S = _hooked_scores(xp, Q, K, mask, score)                  # S = hook(scale Q K^T)
    P, m, l = _softmax_rows(xp, S)                                # P = softmax(S)
    O = P @ V                                                     # O = P V
    L = _log_sum_exp(xp, m, l)[..., 0]  # (NaN in Q or K: l = NaN, and O, L stay NaN)
    return O.transpose(0, 2, 1, 3), L


def attention_naive_same_dtype(q, k, v, causal=False, softmax_scale=None, *,
                               window_size=(-1, -1), softcap=0.0, alibi_slopes=None, diag_shift=0):
    """Standard attention in the inputs' dtype (fp16/bf16), NumPy or CuPy: both matmuls with
    16-bit operands and fp32 accumulation, S rounded to the dtype, the score hook and softmax
    in fp32, P cast back to the dtype, O rounded to the dtype. Returns O only."""
    xp = _xp(q)
    dt = q.dtype
    batch, seqlen_q, nheads, d = q.shape
    mask, score = _features(d, softmax_scale, causal, seqlen_q, k.shape[1], window_size,
                            softcap, alibi_slopes, diag_shift)
    score = dataclasses.replace(score, scale=np.float32(score.scale))
    Q, K, V = (_heads_first_f32(xp, x, nheads) for x in (q, k, v))
    _, S = _hooked_scores(xp, Q, K, mask, score, round_to=dt)
    P = _softmax_rows(xp, S)[0].astype(dt).astype(xp.float32)
    return (P @ V).astype(dt).transpose(0, 2, 1, 3)


def _heads_first_f32(xp, x, nheads):
    x = x.astype(xp.float32).transpose(0, 2, 1, 3)
    return xp.repeat(x, nheads // x.shape[1], axis=1) if x.shape[1] != nheads else x


@dataclass(frozen=True)
class ColumnBlocks:
    begin: int           # first column block visited
    unmasked_begin: int  # [begin, unmasked_begin): masked on the left (a lower key limit)
    masked_begin: int    # [unmasked_begin, masked_begin): no mask; [masked_begin, end): masked
    end: int             # one past the last column block visited


def _cdiv_floor(a: int, b: int) -> int:
    """a / b rounded toward zero, as C's integer division (a may be negative)."""
    return int(a / b) if a < 0 else a // b


def column_blocks(mask: Mask, row_block: int, B_r: int, B_c: int) -> ColumnBlocks:
    """Which column blocks row block `row_block` visits, in three phases. Mirrors
    block_range.cuh line by line."""
    first_row = row_block * B_r
    last_row = min(first_row + B_r, mask.seqlen_q) - 1
    first, last = mask.keys(first_row), mask.keys(last_row)
    begin = max(first[0], 0) // B_c if mask.LOCAL else 0
    end = 0 if last[1] < 0 else last[1] // B_c + 1
    end = max(begin, end)
    unmasked_begin = min(end, max(begin, -(-last[0] // B_c))) if mask.LOCAL else begin
    masked_begin = 0 if first[1] + 1 < 0 else (first[1] + 1) // B_c
    masked_begin = max(unmasked_begin, min(masked_begin, end))
    return ColumnBlocks(begin, unmasked_begin, masked_begin, end)


def attention_fa2_tiled(q, k, v, causal=False, softmax_scale=None, B_r=64, B_c=64,
                        rescale_log2=None, *, window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None, diag_shift=0):
    """The FA2 forward loop, in float64, block by block. Returns (O, L).

    rescale_log2: None keeps m_i at the running row max, as the seed does. A number t keeps
    m_i until a row max passes it by more than t in the exponent of P~ (so P~ <= 2^t), as the
    kernel's lazy rescaling does with t = 8 (fa2_forward.cu, LAZY_RESCALE): O and L come out
    the same, since O~_i and l_i always share the m_i they were computed with.

    Also checks the block plan against the mask: blocks it skips must be fully masked and
    blocks it leaves unmasked must be fully visible (AssertionError otherwise).
    """
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    mask, score = _features(d, softmax_scale, causal, seqlen_q, seqlen_k, window_size, softcap,
                            alibi_slopes, diag_shift)
    Q, K, V = (_heads_to_front(x, nheads) for x in (q, k, v))
    visible = mask.visible()
    O = np.zeros((batch, nheads, seqlen_q, d))
    L = np.zeros((batch, nheads, seqlen_q))
    T_r = -(-seqlen_q // B_r)
    T_c = -(-seqlen_k // B_c)
    for i in range(T_r):                                   # one thread block per row block
        rows = slice(i * B_r, min((i + 1) * B_r, seqlen_q))
        Q_i = Q[:, :, rows]                                # (b, h, B_r, d)
        m_i = np.full(Q_i.shape[:-1], -np.inf)             # running rowmax of S
        l_i = np.zeros(Q_i.shape[:-1])                     # running rowsum of P~
        O_i = np.zeros(Q_i.shape)                          # O~_i, unscaled
        cb = column_blocks(mask, i, B_r, B_c)
        for j in range(T_c):
            cols = slice(j * B_c, min((j + 1) * B_c, seqlen_k))
            block_visible = visible[rows, cols]
            if not cb.begin <= j < cb.end:
                assert not block_visible.any(), f"skipped block ({i}, {j}) has visible keys"
                continue
            whole = cb.unmasked_begin <= j < cb.masked_begin
            if whole:
                assert block_visible.all(), f"unmasked block ({i}, {j}) has masked keys"
            S_ij, row_bias = score.apply_split(                    # S_ij = hook(scale Q_i K_j^T)
                np, Q_i @ K[:, :, cols].transpose(0, 1, 3, 2),        # less its row part (ALiBi
                np.arange(seqlen_q)[rows], np.arange(seqlen_k)[cols],  # on one side of the
                seqlen_q, seqlen_k, mask.left_of_diagonal)            # diagonal), row_bias
            if not whole:
                S_ij = np.where(block_visible, S_ij, -np.inf)
            m_new = np.maximum(m_i, (S_ij.max(axis=-1, keepdims=True)  # m_new = max(m, rowmax S)
                                     + row_bias)[..., 0])             # (the row part back)
            if rescale_log2 is not None:                              # lazy: keep m unless
                with np.errstate(invalid="ignore"):                   # P~ would pass 2^t
                    grow = (m_new - m_i) * math.log2(math.e) > rescale_log2
                m_new = np.where(grow | np.isneginf(m_i), m_new, m_i)
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
            P_ij = np.exp(S_ij - (m_safe[..., None] - row_bias))      # P~ = e^(S - m)
            alpha = np.exp(m_i - m_safe)                              # e^(m_old - m_new)
            l_i = alpha * l_i + P_ij.sum(axis=-1)                     # l = e^(..) l + rowsum P~
            O_i = alpha[..., None] * O_i + P_ij @ V[:, :, cols]       # O~ = diag(..) O~ + P~ V_j
            m_i = m_new
        inv_l = np.divide(1.0, l_i, out=np.zeros_like(l_i), where=l_i != 0)
        O[:, :, rows] = inv_l[..., None] * O_i                         # O_i = diag(l)^-1 O~_i
        L[:, :, rows] = _log_sum_exp(np, m_i, l_i)                     # L = m + log l
    return O.transpose(0, 2, 1, 3), L


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------

def _group_sum(xp, x, nheads_k):
    """(b, h, s, d) -> (b, s, h_k, d): sum the query heads that share a key/value head."""
    b, h, n, d = x.shape
    return x.reshape(b, nheads_k, h // nheads_k, n, d).sum(axis=2).transpose(0, 2, 1, 3)


def attention_backward_naive(dout, q, k, v, causal=False, softmax_scale=None, *,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None, diag_shift=0):
    """Gradients of standard attention in float64 (NumPy, or CuPy for CuPy inputs):
    dV = P^T dO, dP = dO V^T, D = rowsum(dO ∘ O), dS = P ∘ (dP - D) (times the softcap's
    1 - tanh^2), dQ = scale dS K, dK = scale dS^T Q; dK, dV summed over each group of query
    heads (GQA/MQA)."""
    xp = _xp(q)
    nheads, nheads_k, d = q.shape[2], k.shape[2], q.shape[3]
    mask, score = _features(d, softmax_scale, causal, q.shape[1], k.shape[1], window_size,
                            softcap, alibi_slopes, diag_shift)
    Q, K, V, dO = (_heads_to_front(x, nheads) for x in (q, k, v, dout))
    S_raw, S = _hooked_scores(xp, Q, K, mask, score)
    P = _softmax_rows(xp, S)[0]
    O = P @ V
    dV = P.transpose(0, 1, 3, 2) @ dO                              # dV = P^T dO
    dP = dO @ V.transpose(0, 1, 3, 2)                              # dP = dO V^T
    D = (dO * O).sum(axis=-1, keepdims=True)                       # D = rowsum(dO ∘ O)
    dS = score.grad(xp, S_raw, P * (dP - D))                       # dS = hook'(P ∘ (dP - D))
    dQ = score.scale * (dS @ K)                                    # dQ = scale dS K
    dK = score.scale * (dS.transpose(0, 1, 3, 2) @ Q)              # dK = scale dS^T Q
    return dQ.transpose(0, 2, 1, 3), _group_sum(xp, dK, nheads_k), _group_sum(xp, dV, nheads_k)


def attention_backward_naive_same_dtype(dout, q, k, v, causal=False, softmax_scale=None, *,
                                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                        diag_shift=0):
    """The same gradients computed the way autodiff through a 16-bit naive attention would:
    16-bit matmul operands with fp32 accumulation, every matmul result rounded to the dtype,
    the score hook, softmax and their gradients in fp32. Returns (dq, dk, dv) in the inputs'
    dtype."""
    xp = _xp(q)
    dt = q.dtype
    nheads, nheads_k, d = q.shape[2], k.shape[2], q.shape[3]
    mask, score = _features(d, softmax_scale, causal, q.shape[1], k.shape[1], window_size,
                            softcap, alibi_slopes, diag_shift)
    score = dataclasses.replace(score, scale=np.float32(score.scale))

    def rnd(x):
        return x.astype(dt).astype(xp.float32)

    Q, K, V, dO = (_heads_first_f32(xp, x, nheads) for x in (q, k, v, dout))
    S_raw, S = _hooked_scores(xp, Q, K, mask, score, round_to=dt)
    P = rnd(_softmax_rows(xp, S)[0])
    O = rnd(P @ V)
    dV = rnd(P.transpose(0, 1, 3, 2) @ dO)
    dP = rnd(dO @ V.transpose(0, 1, 3, 2))
    D = (dO * O).sum(axis=-1, keepdims=True)
    dS = rnd(score.grad(xp, S_raw, P * (dP - D)).astype(xp.float32))
    dQ = rnd(score.scale * (dS @ K))
    dK = rnd(score.scale * (dS.transpose(0, 1, 3, 2) @ Q))
    return (dQ.astype(dt).transpose(0, 2, 1, 3), _group_sum(xp, dK, nheads_k).astype(dt),
            _group_sum(xp, dV, nheads_k).astype(dt))


def row_blocks(mask: Mask, col_block: int, B_r: int, B_c: int):
    """(begin, end): the row blocks that see column block `col_block`. Mirrors
    block_range.cuh's row_blocks."""
    end = -(-mask.seqlen_q // B_r)
    if mask.LOCAL:
        end = min(end, _cdiv_floor(mask.last_row(col_block * B_c + B_c - 1), B_r) + 1)
    begin = min(end, mask.first_row(col_block * B_c) // B_r)
    return begin, end


def block_needs_mask(mask: Mask, row_block: int, col_block: int, B_r: int, B_c: int) -> bool:
    """Mirrors block_range.cuh's block_needs_mask."""
    first_col = col_block * B_c
    last_col = first_col + B_c - 1
    return bool(last_col > mask.keys(row_block * B_r)[1] or
                (mask.LOCAL and first_col < mask.keys(row_block * B_r + B_r - 1)[0]))


def attention_backward_fa2_tiled(dout, q, k, v, out, lse, causal=False, softmax_scale=None,
                                 B_r=64, B_c=64, *, window_size=(-1, -1), softcap=0.0,
                                 alibi_slopes=None, diag_shift=0):
    """The FA2 backward loop in float64, block by block: column blocks j outside, the row
    blocks i that see them inside, S and P recomputed from the forward's L (lse), dK_j and dV_j
    accumulated per column block, dQ_i accumulated across column blocks. Checks the block plan
    against the mask (AssertionError otherwise). Returns (dq, dk, dv)."""
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    mask, score = _features(d, softmax_scale, causal, seqlen_q, seqlen_k, window_size, softcap,
                            alibi_slopes, diag_shift)
    Q, K, V, dO, O = (_heads_to_front(x, nheads) for x in (q, k, v, dout, out))
    L = np.asarray(lse, dtype=np.float64)                             # (b, h, N_q)
    D = (dO * O).sum(axis=-1)                                         # D = rowsum(dO ∘ O)
    visible = mask.visible()
    dQ = np.zeros(Q.shape)
    dK = np.zeros(K.shape)
    dV = np.zeros(V.shape)
    T_r = -(-seqlen_q // B_r)
    for j in range(-(-seqlen_k // B_c)):                              # one thread block per j
        cols = slice(j * B_c, min((j + 1) * B_c, seqlen_k))
        K_j, V_j = K[:, :, cols], V[:, :, cols]
        dK_j, dV_j = np.zeros(K_j.shape), np.zeros(V_j.shape)
        begin, end = row_blocks(mask, j, B_r, B_c)
        for i in range(T_r):
            rows = slice(i * B_r, min((i + 1) * B_r, seqlen_q))
            block_visible = visible[rows, cols]
            if not begin <= i < end:
                assert not block_visible.any(), f"skipped block ({i}, {j}) has visible keys"
                continue
            masked = block_needs_mask(mask, i, j, B_r, B_c)
            if not masked:
                assert block_visible.all(), f"unmasked block ({i}, {j}) has masked keys"
            S_raw = Q[:, :, rows] @ K_j.transpose(0, 1, 3, 2)         # Q_i K_j^T
            S_ij = score.apply(np, S_raw, np.arange(seqlen_q)[rows],  # S_ij = hook(scale ..)
                               np.arange(seqlen_k)[cols], seqlen_q, seqlen_k)
            with np.errstate(invalid="ignore", over="ignore"):        # masked: inf - inf
                P_ij = np.exp(S_ij - L[:, :, rows, None])             # P_ij = exp(S_ij - L_i)
            if masked:
                P_ij = np.where(block_visible, P_ij, 0.0)
            dV_j += P_ij.transpose(0, 1, 3, 2) @ dO[:, :, rows]       # dV_j += P_ij^T dO_i
            dP_ij = dO[:, :, rows] @ V_j.transpose(0, 1, 3, 2)        # dP_ij = dO_i V_j^T
            dS_ij = score.grad(np, S_raw,                             # dS_ij = hook'(P ∘
                               P_ij * (dP_ij - D[:, :, rows, None]))  #   (dP - D_i))
            dK_j += dS_ij.transpose(0, 1, 3, 2) @ Q[:, :, rows]       # dK_j += dS_ij^T Q_i
            dQ[:, :, rows] += dS_ij @ K_j                             # dQ_i += dS_ij K_j
        dK[:, :, cols] = score.scale * dK_j                           # dK_j = scale sum(..)
        dV[:, :, cols] = dV_j
    return ((score.scale * dQ).transpose(0, 2, 1, 3), _group_sum(np, dK, nheads_k),
            _group_sum(np, dV, nheads_k))


# ---------------------------------------------------------------------------------------------
# Variable length: sequences packed back to back, located by cumulative lengths
# ---------------------------------------------------------------------------------------------

def check_cu_seqlens(cu_seqlens, total: int, name: str = "cu_seqlens") -> np.ndarray:
    """cu_seqlens as an int64 array of length batch + 1, checked: 1-D, at least 2 entries,
    starting at 0, non-decreasing, ending at `total` (the packed arrays' first dimension).
    ValueError otherwise."""
    c = np.asarray(cu_seqlens)
    if c.ndim != 1 or c.size < 2 or not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"{name} must be a 1-D integer sequence of length batch + 1 >= 2, "
                         f"got {c.dtype} shape {c.shape}")
    c = c.astype(np.int64)
    if c[0] != 0 or c[-1] != total or (np.diff(c) < 0).any():
        raise ValueError(f"{name} must start at 0, never decrease and end at {total} (the "
                         f"packed length), got {c.tolist()}")
    return c


def _slopes_of(alibi_slopes, b: int):
    """The (nheads,) ALiBi slopes of batch entry b."""
    if alibi_slopes is None:
        return None
    a = np.asarray(alibi_slopes)
    return a if a.ndim == 1 else a[b]


def attention_naive_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False,
                           softmax_scale=None, *, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None):
    """Standard attention over packed sequences, in float64: q (total_q, nheads, d), k and v
    (total_k, nheads_k, d); sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and
    cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v, attends within itself, and its masks are
    aligned bottom-right on its own lengths (zero-length sequences allowed). Returns O
    (total_q, nheads, d) and L (nheads, total_q), FlashAttention-2's varlen layouts."""
    cq = check_cu_seqlens(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
    ck = check_cu_seqlens(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
    if cq.size != ck.size:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length")
    nheads, d = q.shape[1], q.shape[2]
    O = np.zeros((q.shape[0], nheads, d))
    L = np.zeros((nheads, q.shape[0]))
    for b in range(cq.size - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        O_b, L_b = attention_naive(q[None, qs], k[None, ks], v[None, ks], causal, softmax_scale,
                                   window_size=window_size, softcap=softcap,
                                   alibi_slopes=_slopes_of(alibi_slopes, b))
        O[qs], L[:, qs] = O_b[0], L_b[0]
    return O, L


def attention_fa2_tiled_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal=False,
                               softmax_scale=None, B_r=64, B_c=64, **features):
    """The packed forward as the kernels address it: the grid's row blocks cover the longest
    query sequence (max_seqlen_q) for every entry, and a row block past its entry's end does
    nothing (the portable kernel returns, the Hopper tile walk skips it); each entry's rows are
    found through packed_seq_info's offsets into the flat packed arrays (element strides of
    q (total_q, heads, d): row h d, head d), its tiles run attention_fa2_tiled's loop, and L
    goes to (heads, total_q) through row_vector. Returns (O, L) in the packed layouts, and the
    number of row blocks that did work (the others were skipped)."""
    total_q, nheads, d = q.shape
    nheads_k = k.shape[1]
    cq = check_cu_seqlens(cu_seqlens_q, total_q, "cu_seqlens_q")
    ck = check_cu_seqlens(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
    flat_q, flat_k, flat_v = (np.asarray(x, dtype=np.float64).ravel() for x in (q, k, v))
    O = np.zeros(total_q * nheads * d)
    L = np.zeros(nheads * total_q)
    worked = 0
    slopes = features.pop("alibi_slopes", None)
    for b in range(cq.size - 1):
        seq = packed_seq_info(b, cq, ck, total_q)
        blocks = [i for i in range(-(-max_seqlen_q // B_r)) if i * B_r < seq.seqlen_q]
        worked += len(blocks)
        if not blocks:
            continue

        def rows(flat, offset, n, heads):  # an entry's (1, n, heads, d) through its offset
            return flat[offset:offset + n * heads * d].reshape(1, n, heads, d)

        O_b, L_b = attention_fa2_tiled(
            rows(flat_q, seq.q_offset(0, nheads * d), seq.seqlen_q, nheads),
            rows(flat_k, seq.k_offset(0, nheads_k * d), seq.seqlen_k, nheads_k),
            rows(flat_v, seq.k_offset(0, nheads_k * d), seq.seqlen_k, nheads_k),
            causal, softmax_scale, B_r, B_c, alibi_slopes=_slopes_of(slopes, b), **features)
        at = seq.q_offset(0, nheads * d)
        O[at:at + seq.seqlen_q * nheads * d] = O_b.ravel()
        for h in range(nheads):
            at = seq.row_vector(h, nheads)
            L[at:at + seq.seqlen_q] = L_b[0, h]
    return O.reshape(total_q, nheads, d), L.reshape(nheads, total_q), worked


def attention_backward_naive_varlen(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False,
                                    softmax_scale=None, *, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None):
    """The float64 gradients of :func:`attention_naive_varlen`: (dq, dk, dv) packed like q, k,
    v."""
    cq = check_cu_seqlens(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
    ck = check_cu_seqlens(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(cq.size - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        g = attention_backward_naive(dout[None, qs], q[None, qs], k[None, ks], v[None, ks],
                                     causal, softmax_scale, window_size=window_size,
                                     softcap=softcap, alibi_slopes=_slopes_of(alibi_slopes, b))
        dq[qs], dk[ks], dv[ks] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# FlashAttention-1 forward
# ---------------------------------------------------------------------------------------------

def attention_fa1_tiled(q, k, v, causal=False, softmax_scale=None, B_r=64, B_c=64):
    """Algorithm 1 of FlashAttention in float64: the outer loop walks column blocks j (K_j, V_j
    loaded once), the inner loop the row blocks i that see them; O, l and m are arrays "in
    HBM", read and written back at every inner step. Returns (O, L) like attention_naive."""
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    Q, K, V = (_heads_to_front(x, nheads) for x in (q, k, v))
    mask = Mask(seqlen_q, seqlen_k, causal)
    visible = mask.visible()
    O = np.zeros((batch, nheads, seqlen_q, d))          # O = 0 in HBM
    l = np.zeros((batch, nheads, seqlen_q))             # l = 0
    m = np.full((batch, nheads, seqlen_q), -np.inf)     # m = -inf
    for j in range(-(-seqlen_k // B_c)):                # outer loop: K_j, V_j on chip
        cols = slice(j * B_c, min((j + 1) * B_c, seqlen_k))
        K_j, V_j = K[:, :, cols], V[:, :, cols]
        begin, end = row_blocks(mask, j, B_r, B_c)
        for i in range(begin, end):                     # inner loop: Q_i, O_i, l_i, m_i
            rows = slice(i * B_r, min((i + 1) * B_r, seqlen_q))
            S_ij = scale * (Q[:, :, rows] @ K_j.transpose(0, 1, 3, 2))      # S_ij = Q_i K_j^T
            if block_needs_mask(mask, i, j, B_r, B_c):
                S_ij = np.where(visible[rows, cols], S_ij, -np.inf)
            m_t = S_ij.max(axis=-1)                                        # m~ = rowmax(S)
            m_t_safe = np.where(np.isneginf(m_t), 0.0, m_t)
            P_t = np.exp(S_ij - m_t_safe[..., None])                       # P~ = e^(S - m~)
            l_t = P_t.sum(axis=-1)                                         # l~ = rowsum(P~)
            m_i, l_i, O_i = m[:, :, rows], l[:, :, rows], O[:, :, rows]   # read from HBM
            m_new = np.maximum(m_i, m_t)                                   # m_new
            m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
            alpha = l_i * np.exp(m_i - m_safe)                             # l_i e^(m_i - m_new)
            beta = np.exp(m_t - m_safe)                                    # e^(m~ - m_new)
            l_new = alpha + beta * l_t                                     # l_new
            inv = np.divide(1.0, l_new, out=np.zeros_like(l_new), where=l_new != 0)
            O[:, :, rows] = inv[..., None] * (alpha[..., None] * O_i       # O_i = diag(l_new)^-1
                                              + beta[..., None] * (P_t @ V_j))  # (...)
            l[:, :, rows], m[:, :, rows] = l_new, m_new                    # write back to HBM
    return O.transpose(0, 2, 1, 3), _log_sum_exp(np, m, l)


# ---------------------------------------------------------------------------------------------
# KV-cache decoding (forward_kvcache): paged caches, in-place append, split-KV
# ---------------------------------------------------------------------------------------------

def cache_capacity(k_cache, block_table=None) -> int:
    """How many key rows one batch entry's cache holds: the contiguous cache's second
    dimension, or the paged cache's page size times the block table's pages per entry."""
    if block_table is None:
        return k_cache.shape[1]
    return k_cache.shape[1] * np.asarray(block_table).shape[1]


def check_kvcache(k_cache, cache_seqlens, seqlen_new: int, batch: int, block_table=None,
                  capacity: int | None = None):
    """cache_seqlens as an int64 array (batch,), checked against the cache: each entry's
    cached keys plus the seqlen_new appended ones must fit its capacity (cache_capacity, or
    `capacity` where given: a paged cache whose table stays unread); a block table's entries
    must name pages of the cache (those an entry uses). ValueError otherwise."""
    c = np.asarray(cache_seqlens)
    if c.ndim == 0:
        c = np.full(batch, int(c))
    if c.shape != (batch,) or not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"cache_seqlens must be an integer or {batch} integers, got "
                         f"{c.dtype} shape {c.shape}")
    c = c.astype(np.int64)
    cap = cache_capacity(k_cache, block_table) if capacity is None else capacity
    if (c < 0).any() or (c + seqlen_new > cap).any():
        raise ValueError(f"cache_seqlens plus the {seqlen_new} appended keys must lie in "
                         f"0..{cap} (the cache's capacity), got {c.tolist()}")
    if block_table is not None:
        bt = np.asarray(block_table)
        page = k_cache.shape[1]
        for b in range(batch):
            used = bt[b, :-(-int(c[b] + seqlen_new) // page)]
            if ((used < 0) | (used >= k_cache.shape[0])).any():
                raise ValueError(f"block_table[{b}] names pages outside 0..{k_cache.shape[0] - 1}"
                                 f": {used.tolist()}")
    return c


def cache_rows(cache, b: int, n: int, block_table=None):
    """Logical key rows 0..n-1 of batch entry b, (n, heads_k, d): cache[b, :n] for a
    contiguous cache (batch, capacity, heads_k, d); for a paged one (num_pages, page_size,
    heads_k, d), row j is in page block_table[b, j // page_size] at j % page_size."""
    if block_table is None:
        return cache[b, :n]
    page = cache.shape[1]
    j = np.arange(n)
    return cache[np.asarray(block_table)[b, j // page], j % page]


def kvcache_append(k_cache, v_cache, cache_seqlens, k, v, block_table=None):
    """Copies of the caches with k, v (batch, seqlen_new, heads_k, d) written at rows
    cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 of each entry (through the block
    table when paged): what forward_kvcache does in place before attending."""
    kc, vc = np.array(k_cache), np.array(v_cache)
    c = check_kvcache(kc, cache_seqlens, k.shape[1], k.shape[0], block_table)
    for b in range(k.shape[0]):
        j = c[b] + np.arange(k.shape[1])
        if block_table is None:
            kc[b, j], vc[b, j] = k[b], v[b]
        else:
            page = kc.shape[1]
            at = (np.asarray(block_table)[b, j // page], j % page)
            kc[at], vc[at] = k[b], v[b]
    return kc, vc


def attention_kvcache_naive(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None,
                            block_table=None, causal=False, softmax_scale=None,
                            window_size=(-1, -1), softcap=0.0, alibi_slopes=None):
    """Decoding against a KV cache, in float64: k, v (if given) appended first
    (kvcache_append), then entry b's queries q[b] (seqlen_q, nheads, d) attend to its first
    cache_seqlens[b] + seqlen_new keys, masks aligned bottom-right on that length (the new
    queries are the last positions). Returns (O, L) as attention_naive does."""
    batch, seqlen_q, nheads, d = q.shape
    O = np.zeros((batch, seqlen_q, nheads, d))
    L = np.zeros((batch, nheads, seqlen_q))
    for b, K, V in _kvcache_entries(q, k_cache, v_cache, cache_seqlens, k, v, block_table):
        O[b], L[b] = (x[0] for x in attention_naive(
            q[b:b + 1], K[None], V[None], causal, softmax_scale, window_size=window_size,
            softcap=softcap, alibi_slopes=_slopes_of(alibi_slopes, b)))
    return O, L


def _kvcache_entries(q, k_cache, v_cache, cache_seqlens, k, v, block_table):
    """(b, K_b, V_b) for each batch entry: its keys and values after the append of k, v (if
    given), K_b (cache_seqlens[b] + seqlen_new, heads_k, d)."""
    new = 0 if k is None else k.shape[1]
    if k is not None:
        k_cache, v_cache = kvcache_append(k_cache, v_cache, cache_seqlens, k, v, block_table)
    c = check_kvcache(k_cache, cache_seqlens, new, q.shape[0], block_table)
    for b in range(q.shape[0]):
        n = int(c[b]) + new
        yield b, cache_rows(k_cache, b, n, block_table), cache_rows(v_cache, b, n, block_table)


def kvcache_splits(seqlen_k: int, B_c: int, num_splits: int) -> list:
    """The column blocks [begin, end) each of num_splits thread blocks takes of a key range of
    seqlen_k: ceil(T_c / num_splits) blocks each, in order, so the last splits may be empty
    (begin >= end) when the range is short."""
    T_c = -(-seqlen_k // B_c)
    per = max(1, -(-T_c // num_splits))
    return [(min(s * per, T_c), min((s + 1) * per, T_c)) for s in range(num_splits)]


def num_splits_for(batch: int, heads_k: int, row_tiles: int, seqlen_k: int, num_slots: int,
                   B_c: int, nwarps: int = 4, *, paged: bool = False,
                   max_splits: int = 64) -> int:
    """How many splits of the key range a decode launch takes (num_splits=0). num_slots: the
    thread blocks the GPU holds at once (SMs x blocks per SM). From the H200 sweep of
    2026-12-01 (PERFORMANCE.md): a thread block costs a few microseconds of its own (Q, the
    pipeline's fill, the warps' combine, its partials), and at batch 1 blocks on half the SMs
    read as fast as blocks on all of them. So:
    - the blocks aim at half the slots: 1 split when batch x heads_k x row_tiles blocks
      already make 80% of that. A paged cache aims at all of them where its blocks would each
      hold more than 2048 keys on half: a paged block reads more slowly (at batch 1 x 128k
      keys half the slots took 1.15-1.4x the contiguous time, all of them 1.00-1.06x; batch
      4 x 8k, 4k keys a block, 1.04-1.12x and 1.02-1.05x), but short (1k keys a block at
      batch 1 x 8k) it pays more for the extra blocks (25.8-27.6 us on 8 splits, 28.8-29.0
      on 16; session 9's sweep);
    - the splits leave each warp at least 2 column blocks on average (a 3-buffer pipeline then
      has both in flight; the last split may be shorter);
    - else the fewest splits within 5% of the best wave efficiency over the slots aimed at
      (thread blocks / (waves x those slots)), at most max_splits."""
    tiles = batch * heads_k * row_tiles
    half = max(1, num_slots // 2)
    target = num_slots if paged and seqlen_k * tiles > 2048 * half else half
    if tiles == 0 or tiles >= 0.8 * target:  # (no tiles: nothing to split)
        return 1
    T_c = -(-seqlen_k // B_c)
    top = max(1, min(max_splits, T_c // (2 * nwarps)))

    def efficiency(s):
        n = tiles * s
        return n / (-(-n // target) * target)

    best = max(efficiency(s) for s in range(1, top + 1))
    return next(s for s in range(1, top + 1) if efficiency(s) >= 0.95 * best)


def attention_kvcache_split(q, k_cache, v_cache, cache_seqlens, *, num_splits: int, B_c=64,
                            k=None, v=None, block_table=None, causal=False, softmax_scale=None,
                            window_size=(-1, -1), softcap=0.0, alibi_slopes=None):
    """Split-KV decoding as the kernels run it (FlashDecoding), in float64. The G = nheads /
    heads_k query heads of a KV head are packed into the rows of one tile (row r = g seqlen_q
    + i holds query head hk G + g at position i), so K and V are read once per KV head. Each
    split takes its column blocks (kvcache_splits) and gives, per row, a partial
    O_s = softmax over its keys times V and L_s = m_s + log l_s (O_s = 0, L_s = -inf where the
    row sees none of its keys); the combine is exact:
        L = log sum_s e^(L_s),   O = sum_s e^(L_s - L) O_s.
    Returns (O, L) as attention_kvcache_naive does."""
    batch, seqlen_q, nheads, d = q.shape
    nheads_k = k_cache.shape[2]
    G = nheads // nheads_k
    O = np.zeros((batch, seqlen_q, nheads, d))
    L = np.zeros((batch, nheads, seqlen_q))
    for b, K_all, V_all in _kvcache_entries(q, k_cache, v_cache, cache_seqlens, k, v,
                                            block_table):
        n = K_all.shape[0]
        K_all, V_all = (np.asarray(x, dtype=np.float64) for x in (K_all, V_all))
        mask, score = _features(d, softmax_scale, causal, seqlen_q, n, window_size, softcap,
                                _slopes_of(alibi_slopes, b))
        visible = mask.visible()                                     # (seqlen_q, n)
        for hk in range(nheads_k):
            heads = hk * G + np.arange(G)
            Q = np.asarray(q[b][:, heads], dtype=np.float64).transpose(1, 0, 2)  # (G, sq, d)
            group_score = Score(score.scale, score.softcap, None if score.alibi_slopes is None
                                else np.asarray(score.alibi_slopes)[heads])
            O_s, L_s = [], []
            for begin, end in kvcache_splits(n, B_c, num_splits):
                cols = np.arange(begin * B_c, min(end * B_c, n))
                S_raw = Q @ K_all[cols, hk].T                                # (G, sq, keys)
                S = group_score.apply(np, S_raw[None], np.arange(seqlen_q), cols, seqlen_q, n)
                S = np.where(visible[None, None, :, cols], S, -np.inf)[0]    # (G, sq, keys)
                P, m, l_split = _softmax_rows(np, S)  # over this split's keys; 0 if none
                O_s.append(P @ V_all[cols, hk])
                L_s.append(_log_sum_exp(np, m, l_split)[..., 0])
            L_s, O_s = np.stack(L_s), np.stack(O_s)                  # (splits, G, sq[, d])
            top = L_s.max(axis=0)
            top_safe = np.where(np.isfinite(top), top, 0.0)
            w = np.exp(L_s - top_safe)                               # e^(L_s - max L_s)
            total = w.sum(axis=0)
            with np.errstate(divide="ignore"):
                L_hk = np.where(total > 0, top_safe + np.log(np.where(total > 0, total, 1.0)),
                                -np.inf)                             # L = log sum e^(L_s)
            O_hk = (w[..., None] * O_s).sum(axis=0) / np.where(total > 0, total, 1.0)[..., None]
            O[b][:, heads] = O_hk.transpose(1, 0, 2)                 # O = sum e^(L_s - L) O_s
            L[b][heads] = L_hk
    return O, L
