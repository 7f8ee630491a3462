// block_range.cuh: which blocks of the other side a block visits, and which need a mask.
//
// Forward: the column blocks of K/V that row block i of Q visits, in three phases:
//     [begin, unmasked_begin)        masked on the left  (a lower key limit cuts them: windows)
//     [unmasked_begin, masked_begin) no mask             (every row sees every key)
//     [masked_begin, end)            masked on the right (the causal diagonal, the end of K)
// Backward: the row blocks that see column block j, [begin, end), and whether block (i, j)
// needs the element mask. Everything here follows from Mask::keys (mask.cuh): row blocks lower
// down see keys further right, so the first row of a block bounds what all its rows see on the
// right, and the last row what any of them sees. cuflash/reference.py mirrors these functions
// line for line, so that the CPU simulations visit exactly the blocks the GPU visits.
#pragma once

#include "mask.cuh"

namespace cuflash {

struct ColumnBlocks {
    int begin;           // first column block visited
    int unmasked_begin;  // [begin, unmasked_begin): masked on the left
    int masked_begin;    // [unmasked_begin, masked_begin): no mask; [masked_begin, end): masked
    int end;             // one past the last column block visited
};

// Row block `row_block` holds query rows [row_block * B_r, min((row_block + 1) * B_r, seqlen_q)).
template <int B_r, int B_c, class MaskT>
__device__ __forceinline__ ColumnBlocks column_blocks(const MaskT mask, int row_block) {
    const int first_row = row_block * B_r;
    const int last_row = min(first_row + B_r, mask.seqlen_q) - 1;
    const KeyRange first = MaskT::keys_of(mask, first_row), last = MaskT::keys_of(mask, last_row);
    ColumnBlocks cb;
    // Visited: the keys any row sees, [first.lo, last.hi].
    cb.begin = MaskT::LOCAL ? max(first.lo, 0) / B_c : 0;
    cb.end = last.hi < 0 ? 0 : last.hi / B_c + 1;
    cb.end = max(cb.begin, cb.end);
    // No mask: blocks inside [last.lo, first.hi], the keys every row sees.
    cb.unmasked_begin = MaskT::LOCAL ? min(cb.end, max(cb.begin, (last.lo + B_c - 1) / B_c))
                                     : cb.begin;
    // Block j needs no mask on the right iff its last column (j + 1) * B_c - 1 <= first.hi.
    cb.masked_begin = first.hi + 1 < 0 ? 0 : (first.hi + 1) / B_c;
    cb.masked_begin = max(cb.unmasked_begin, min(cb.masked_begin, cb.end));
    return cb;
}

// Backward: column block `col_block` (keys [col_block * B_c, ...)) is seen by the row blocks
// [begin, end).
struct RowBlocks {
    int begin, end;
};

template <int B_r, int B_c, class MaskT>
__device__ __forceinline__ RowBlocks row_blocks(const MaskT& mask, int col_block) {
    RowBlocks rb;
    rb.end = (mask.seqlen_q + B_r - 1) / B_r;
    if (MaskT::LOCAL) rb.end = min(rb.end, mask.last_row(col_block * B_c + B_c - 1) / B_r + 1);
    // (written so that without a causal or window limit begin is the constant 0: the clamp
    // of 0 to end, which the compiler cannot fold, changed the backward's schedule)
    rb.begin = 0;
    if (MaskT::CAUSAL || MaskT::LOCAL)
        rb.begin = min(rb.end, mask.first_row(col_block * B_c) / B_r);
    return rb;
}

// Block (row_block, col_block) needs the element mask unless every row of the row block sees
// every key of the column block (the column block may also be cut by the end of K).
template <int B_r, int B_c, class MaskT>
__device__ __forceinline__ bool block_needs_mask(const MaskT& mask, int row_block, int col_block) {
    const int first_col = col_block * B_c, last_col = first_col + B_c - 1;
    return last_col > mask.keys(row_block * B_r).hi ||
           (MaskT::LOCAL && first_col < mask.keys(row_block * B_r + B_r - 1).lo);
}

}  // namespace cuflash
