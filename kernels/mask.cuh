// mask.cuh: which keys a query row sees, and nothing else.
//
// One function, Mask::keys(row), gives the key range [lo, hi] of a query row; every element
// mask in every kernel and every block range (block_range.cuh) is computed from it (the
// causal mask's fast form in mask_fragment, below, from the same formula), and
// cuflash/reference.py mirrors it (`Mask.keys`). Masks are limits of that range, counted from
// the row's diagonal key row + seqlen_k - seqlen_q (aligned to the bottom-right corner as in
// FlashAttention-2, so that when seqlen_q > seqlen_k the first causal rows see nothing: their
// output is 0 and their log-sum-exp -inf):
//   - the end of K:    hi <= seqlen_k - 1;
//   - CAUSAL:          an upper limit, hi <= diagonal + right; right = 0 (causal) unless the
//                      mask is also LOCAL, which reads it from the parameters (a window's right
//                      side, >= 0, or any int where ring attention's blocks shift the diagonal:
//                      cuflash/_api.py _window);
//   - LOCAL:           a lower limit, lo >= diagonal - left (a sliding window's left side, any
//                      int likewise; p.window_left, p.window_right). Where it is false every
//                      test of lo compiles away.
// A new mask changes this header, the reference and the API: the kernels take the Mask type as
// a template parameter and ask it.
#pragma once

#include "common.cuh"

namespace cuflash {

// The keys one query row sees: [lo, hi]; none when hi < lo.
struct KeyRange {
    int lo, hi;
};

template <bool CAUSAL_, bool LOCAL_ = false>
struct Mask {
    static constexpr bool CAUSAL = CAUSAL_, LOCAL = LOCAL_;
    int seqlen_q, seqlen_k;
    int left, right;  // LOCAL: the window's sides (0 otherwise, and never read)

    // The mask of one batch entry (its lengths, from SeqInfo); the window's sides come from
    // the kernel's parameter struct, read here and nowhere else.
    template <class Params>
    __device__ __forceinline__ Mask(const Params& p, int seqlen_q_, int seqlen_k_)
        : seqlen_q(seqlen_q_), seqlen_k(seqlen_k_), left(LOCAL ? p.window_left : 0),
          right(LOCAL ? p.window_right : 0) {}

    // The keys query row `row` sees. (The formula is the static keys_of, which takes the mask
    // by value: block_range.cuh calls it so. Reading the fields through `this` there changed
    // how ptxas scheduled the forward's main loop, 4-6% slower at d 64 and d 256; see
    // PERFORMANCE.md, 2026-11-30.)
    __device__ __forceinline__ KeyRange keys(int row) const { return keys_of(*this, row); }
    static __device__ __forceinline__ KeyRange keys_of(const Mask m, int row) {
        int hi = m.seqlen_k - 1, lo = 0;
        if (CAUSAL) hi = min(hi, row + m.seqlen_k - m.seqlen_q + (LOCAL ? m.right : 0));
        if (LOCAL) lo = max(0, row + m.seqlen_k - m.seqlen_q - m.left);
        return {lo, hi};
    }
    // The first query row that sees a key in [col_lo, col_hi] (rows further down see keys
    // further right; the backward's row ranges).
    __device__ __forceinline__ int first_row(int col_lo) const {
        return CAUSAL ? max(0, col_lo - (seqlen_k - seqlen_q) - (LOCAL ? right : 0)) : 0;
    }
    // The last query row that sees a key in [col_lo, col_hi] (a lower limit cuts rows below;
    // negative when no row does).
    __device__ __forceinline__ int last_row(int col_hi) const {
        return LOCAL ? min(seqlen_q - 1, col_hi - (seqlen_k - seqlen_q) + left) : seqlen_q - 1;
    }
    // No row sees a key right of its diagonal (col <= row + seqlen_k - seqlen_q for every
    // visible key): the causal mask. ALiBi's |distance| is then the distance itself
    // (score.cuh's row_bias form). (A window whose right side is 0 has the property too; it
    // is left out because testing it at run time spilled the d 256 Hopper tile with the hook.)
    static constexpr bool LEFT_OF_DIAGONAL = CAUSAL && !LOCAL;
    // The element mask: whether key `col` is hidden from a row whose key range is [lo, hi]
    // (all three counted from the same origin, usually the lane's first column of the block).
    static __device__ __forceinline__ bool hidden(int col, int lo, int hi) {
        return col > hi || (LOCAL && col < lo);
    }
};

// The element mask on one row pair of an mma accumulator fragment (the portable kernels'
// m16n8 tiles and the wgmma accumulator alike): this lane holds the fragment's rows e2 = 0, 1,
// the queries row_of(e2), and, in each of the NT n8 tiles of keys from col0, columns
// 2 (lane % 4) and + 1. S[r, c] = -inf where key c is hidden from query r.
template <class MaskT, int NT, class RowOf>
__device__ __forceinline__ void mask_fragment_rows(const MaskT& mask, float (&s)[NT][4],
                                                   RowOf&& row_of, int col0, int lane) {
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
        // this row's keys, counted from the block's first key
        const KeyRange keys = mask.keys(row_of(e2));
        const int lo = keys.lo - col0, hi = keys.hi - col0;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1)
                if (MaskT::hidden(nt * 8 + (lane % 4) * 2 + e1, lo, hi))
                    s[nt][e2 * 2 + e1] = CUFLASH_NEG_INF;
    }
}
// ... where the lane's rows are consecutive queries `row` and `row` + 8 (every kernel but the
// decode, whose rows pack several heads' queries). Under the causal mask alone, row's last key
// is hi = row + seqlen_k - seqlen_q, never past the end of K for row < seqlen_q (rows from
// seqlen_q on are not stored: they are left to see the keys past it), so row + 8's is hi + 8,
// and its test in n8 tile nt is row's in tile nt - 1: one comparison for two elements, each
// against a constant (the limit counted from the lane's first key). (The same constant
// comparisons for the other masks spilled the d 256 Hopper tiles.) SHARED = false keeps the
// per-row tests under the causal mask too: the Hopper forward's tiles with the score hook,
// where the shared tests spilled the d 128 and 256 tiles.
template <bool SHARED = true, class MaskT, int NT>
__device__ __forceinline__ void mask_fragment(const MaskT& mask, float (&s)[NT][4], int row,
                                              int col0, int lane) {
    if constexpr (SHARED && MaskT::CAUSAL && !MaskT::LOCAL) {
        const int hi = row + mask.seqlen_k - mask.seqlen_q - (col0 + (lane % 4) * 2);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e1 = 0; e1 < 2; ++e1) {
                const bool hidden = nt * 8 + e1 > hi;  // key 8 nt + e1 from row, 8 (nt + 1) + e1
                if (hidden) s[nt][e1] = CUFLASH_NEG_INF;  // from row + 8
                if (nt + 1 < NT && hidden) s[nt + 1][2 + e1] = CUFLASH_NEG_INF;
            }
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1)
            if (e1 > hi + 8) s[0][2 + e1] = CUFLASH_NEG_INF;  // (row + 8, tile 0)
    } else {
        mask_fragment_rows(mask, s, [&](int e2) { return row + 8 * e2; }, col0, lane);
    }
}

// The same on a transposed fragment, S^T = K Q^T (the Hopper backward: rows are keys,
// columns queries): this lane holds keys `key` and `key` + 8 (e2 = 0, 1) and, in each of the
// NT n8 tiles of queries from query0, queries 2 (lane % 4) and + 1. S^T[c, r] = -inf where key
// c is hidden from query r.
template <class MaskT, int NT>
__device__ __forceinline__ void mask_fragment_transposed(const MaskT& mask, float (&s)[NT][4],
                                                         int key, int query0, int lane) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e1 = 0; e1 < 2; ++e1) {
            // this query's keys, counted from the lane's first key
            const KeyRange keys = mask.keys(query0 + nt * 8 + (lane % 4) * 2 + e1);
            const int lo = keys.lo - key, hi = keys.hi - key;
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2)
                if (MaskT::hidden(8 * e2, lo, hi)) s[nt][e2 * 2 + e1] = CUFLASH_NEG_INF;
        }
}

}  // namespace cuflash
