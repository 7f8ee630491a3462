// block_range.cuh: which column blocks of K/V a row block of Q visits, and which need a mask.
//
// This is the one place that decides the shape of the attention mask at block level. Every
// kernel (forward and backward) asks it, and cuflash/reference.py mirrors it line for line
// (`column_blocks`) so the CPU simulation visits exactly the blocks the GPU visits.
// Later masks (variable-length batches, sliding windows) change `begin`/`end` and
// `visible_limit` here and nowhere else.
//
// Causal masking is aligned bottom-right, as in FlashAttention-2: query row i sees key column
// j iff j <= i + (seqlen_k - seqlen_q). When seqlen_q > seqlen_k the first rows see nothing;
// their output is 0 and their log-sum-exp L is -inf.
#pragma once

namespace cuflash {

struct ColumnBlocks {
    int begin;         // first column block j visited
    int masked_begin;  // blocks in [begin, masked_begin) need no element mask ...
    int end;           // ... blocks in [masked_begin, end) do; `end` is one past the last
};

// The last key column query row `row` may see (may be < 0: the row sees nothing).
template <bool CAUSAL>
__device__ __forceinline__ int visible_limit(int row, int seqlen_q, int seqlen_k) {
    int limit = seqlen_k - 1;
    if (CAUSAL) limit = min(limit, row + seqlen_k - seqlen_q);
    return limit;
}

// Row block `row_block` holds query rows [row_block * B_r, min((row_block + 1) * B_r, seqlen_q)).
template <int B_r, int B_c, bool CAUSAL>
__device__ __forceinline__ ColumnBlocks column_blocks(int row_block, int seqlen_q, int seqlen_k) {
    const int first_row = row_block * B_r;
    const int last_row = min(first_row + B_r, seqlen_q) - 1;
    // Rows further down see at least as much: the last row bounds the blocks visited, the
    // first row bounds the blocks that every row sees whole.
    const int last_any = visible_limit<CAUSAL>(last_row, seqlen_q, seqlen_k);
    const int last_all = visible_limit<CAUSAL>(first_row, seqlen_q, seqlen_k);
    ColumnBlocks cb;
    cb.begin = 0;
    cb.end = last_any < 0 ? 0 : last_any / B_c + 1;
    // Block j needs no mask iff its last column (j + 1) * B_c - 1 <= last_all.
    cb.masked_begin = last_all + 1 < 0 ? 0 : (last_all + 1) / B_c;
    cb.masked_begin = max(cb.begin, min(cb.masked_begin, cb.end));
    return cb;
}

// Backward: column block `col_block` (keys [col_block * B_c, ...)) is seen by the row blocks
// [begin, end); block (i, j) needs an element mask unless every row of row block i sees every
// key of column block j (and the column block is not cut by the end of K).
struct RowBlocks {
    int begin, end;
};

template <int B_r, int B_c, bool CAUSAL>
__device__ __forceinline__ RowBlocks row_blocks(int col_block, int seqlen_q, int seqlen_k) {
    RowBlocks rb;
    rb.end = (seqlen_q + B_r - 1) / B_r;
    rb.begin = 0;
    if (CAUSAL) {
        // The first query row that sees key col_block * B_c: row + seqlen_k - seqlen_q >= key.
        const int first_row = max(0, col_block * B_c - (seqlen_k - seqlen_q));
        rb.begin = min(rb.end, first_row / B_r);
    }
    return rb;
}

template <int B_r, int B_c, bool CAUSAL>
__device__ __forceinline__ bool block_needs_mask(int row_block, int col_block, int seqlen_q,
                                                 int seqlen_k) {
    const int last_col = (col_block + 1) * B_c - 1;
    return last_col > visible_limit<CAUSAL>(row_block * B_r, seqlen_q, seqlen_k);
}

}  // namespace cuflash
