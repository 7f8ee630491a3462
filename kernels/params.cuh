// params.cuh: the kernels' parameter structs, one per kernel family.
//
// Generated from cuflash/_params.py (which also packs them on the host) by
// `python -m cuflash.compile_check --write-params`: edit that file, not this one.
#pragma once

namespace cuflash {

// Forward kernels (fa2_forward.cu, fa1_forward.cu).
struct FwdParams {
    const elem_t* q;                // Q (batch, seqlen_q, heads, d)
    const elem_t* k;                // K (batch, seqlen_k, heads_k, d)
    const elem_t* v;                // V, as K
    elem_t* o;                      // O, Q's shape (its own strides)
    float* lse;                     // L (batch, heads, seqlen_q), float32, contiguous; packed: (heads, total_q)
    float* o_accum;                 // FA1: O in float32 (batch, heads, seqlen_q, d)
    float* l_accum;                 // FA1: l (batch, heads, seqlen_q)
    float* m_accum;                 // FA1: m (batch, heads, seqlen_q)
    long long q_stride_b;           // Q: batch stride in elements
    long long q_stride_s;           // Q: sequence stride in elements
    long long q_stride_h;           // Q: head stride in elements
    long long k_stride_b;           // K: batch stride in elements
    long long k_stride_s;           // K: sequence stride in elements
    long long k_stride_h;           // K: head stride in elements
    long long v_stride_b;           // V: batch stride in elements
    long long v_stride_s;           // V: sequence stride in elements
    long long v_stride_h;           // V: head stride in elements
    long long o_stride_b;           // O: batch stride in elements
    long long o_stride_s;           // O: sequence stride in elements
    long long o_stride_h;           // O: head stride in elements
    int seqlen_q;                   // query rows per batch entry
    int seqlen_k;                   // key rows per batch entry
    int d;                          // head dim (a multiple of 8, at most the kernel's bucket)
    int group;                      // query heads per kv head (head h reads kv head h / group)
    float softmax_scale;            // scale of S = Q K^T
    float scale_log2;               // softmax_scale * log2(e): exp(scale x) = exp2(scale_log2 x)
    int window_left;                // LOCAL masks: keys before the diagonal
    int window_right;               // LOCAL masks: keys after the diagonal (CAUSAL: its upper limit)
    const float* alibi_slopes;      // ALiBi slopes per (batch, head), float32
    float softcap_in;               // softmax_scale / softcap (0: no softcap)
    float softcap_out;              // softcap / softmax_scale
    float softcap_log2;             // softcap * log2(e) (Hopper backward: the softcap's exponent without ALiBi)
    int alibi_stride_b;             // batch stride of alibi_slopes (0: one row for all)
    float alibi_shift;              // ALiBi, dense: row i's diagonal is key i + seqlen_k - seqlen_q + alibi_shift (ring attention's blocks)
    const int* cu_seqlens_q;        // packed: cumulative query lengths (batch + 1), int32
    const int* cu_seqlens_k;        // packed: cumulative key lengths (batch + 1), int32
    int total_q;                    // packed: rows of the packed query tensor
};
static_assert(sizeof(FwdParams) == 248, "FwdParams: size differs from cuflash/_params.py");
#ifndef __CUDACC_RTC__
static_assert(__builtin_offsetof(FwdParams, q) == 0, "FwdParams.q");
static_assert(__builtin_offsetof(FwdParams, k) == 8, "FwdParams.k");
static_assert(__builtin_offsetof(FwdParams, v) == 16, "FwdParams.v");
static_assert(__builtin_offsetof(FwdParams, o) == 24, "FwdParams.o");
static_assert(__builtin_offsetof(FwdParams, lse) == 32, "FwdParams.lse");
static_assert(__builtin_offsetof(FwdParams, o_accum) == 40, "FwdParams.o_accum");
static_assert(__builtin_offsetof(FwdParams, l_accum) == 48, "FwdParams.l_accum");
static_assert(__builtin_offsetof(FwdParams, m_accum) == 56, "FwdParams.m_accum");
static_assert(__builtin_offsetof(FwdParams, q_stride_b) == 64, "FwdParams.q_stride_b");
static_assert(__builtin_offsetof(FwdParams, q_stride_s) == 72, "FwdParams.q_stride_s");
static_assert(__builtin_offsetof(FwdParams, q_stride_h) == 80, "FwdParams.q_stride_h");
static_assert(__builtin_offsetof(FwdParams, k_stride_b) == 88, "FwdParams.k_stride_b");
static_assert(__builtin_offsetof(FwdParams, k_stride_s) == 96, "FwdParams.k_stride_s");
static_assert(__builtin_offsetof(FwdParams, k_stride_h) == 104, "FwdParams.k_stride_h");
static_assert(__builtin_offsetof(FwdParams, v_stride_b) == 112, "FwdParams.v_stride_b");
static_assert(__builtin_offsetof(FwdParams, v_stride_s) == 120, "FwdParams.v_stride_s");
static_assert(__builtin_offsetof(FwdParams, v_stride_h) == 128, "FwdParams.v_stride_h");
static_assert(__builtin_offsetof(FwdParams, o_stride_b) == 136, "FwdParams.o_stride_b");
static_assert(__builtin_offsetof(FwdParams, o_stride_s) == 144, "FwdParams.o_stride_s");
static_assert(__builtin_offsetof(FwdParams, o_stride_h) == 152, "FwdParams.o_stride_h");
static_assert(__builtin_offsetof(FwdParams, seqlen_q) == 160, "FwdParams.seqlen_q");
static_assert(__builtin_offsetof(FwdParams, seqlen_k) == 164, "FwdParams.seqlen_k");
static_assert(__builtin_offsetof(FwdParams, d) == 168, "FwdParams.d");
static_assert(__builtin_offsetof(FwdParams, group) == 172, "FwdParams.group");
static_assert(__builtin_offsetof(FwdParams, softmax_scale) == 176, "FwdParams.softmax_scale");
static_assert(__builtin_offsetof(FwdParams, scale_log2) == 180, "FwdParams.scale_log2");
static_assert(__builtin_offsetof(FwdParams, window_left) == 184, "FwdParams.window_left");
static_assert(__builtin_offsetof(FwdParams, window_right) == 188, "FwdParams.window_right");
static_assert(__builtin_offsetof(FwdParams, alibi_slopes) == 192, "FwdParams.alibi_slopes");
static_assert(__builtin_offsetof(FwdParams, softcap_in) == 200, "FwdParams.softcap_in");
static_assert(__builtin_offsetof(FwdParams, softcap_out) == 204, "FwdParams.softcap_out");
static_assert(__builtin_offsetof(FwdParams, softcap_log2) == 208, "FwdParams.softcap_log2");
static_assert(__builtin_offsetof(FwdParams, alibi_stride_b) == 212, "FwdParams.alibi_stride_b");
static_assert(__builtin_offsetof(FwdParams, alibi_shift) == 216, "FwdParams.alibi_shift");
static_assert(__builtin_offsetof(FwdParams, cu_seqlens_q) == 224, "FwdParams.cu_seqlens_q");
static_assert(__builtin_offsetof(FwdParams, cu_seqlens_k) == 232, "FwdParams.cu_seqlens_k");
static_assert(__builtin_offsetof(FwdParams, total_q) == 240, "FwdParams.total_q");
#endif

// Backward kernels (fa2_backward.cu).
struct BwdParams {
    const elem_t* q;                // Q (batch, seqlen_q, heads, d)
    const elem_t* k;                // K (batch, seqlen_k, heads_k, d)
    const elem_t* v;                // V, as K
    const elem_t* o;                // O, the forward's output (preprocess)
    const elem_t* dout;             // dO, Q's shape
    const float* lse;               // L (batch, heads, seqlen_q), float32
    float* dsum;                    // D = rowsum(dO o O) (batch, heads, seqlen_q), float32
    float* dq_accum;                // float32 dQ sums (layout: fa2_backward.cu)
    int* dq_order;                  // ordered mode: turn counters (batch, heads, T_r)
    elem_t* dq;                     // dQ, Q's shape (its own strides)
    void* dk;                       // dK: input dtype, or float32 slices (head_parts > 1)
    void* dv;                       // dV, as dK
    long long q_stride_b;           // Q: batch stride in elements
    long long q_stride_s;           // Q: sequence stride in elements
    long long q_stride_h;           // Q: head stride in elements
    long long k_stride_b;           // K: batch stride in elements
    long long k_stride_s;           // K: sequence stride in elements
    long long k_stride_h;           // K: head stride in elements
    long long v_stride_b;           // V: batch stride in elements
    long long v_stride_s;           // V: sequence stride in elements
    long long v_stride_h;           // V: head stride in elements
    long long o_stride_b;           // O: batch stride in elements
    long long o_stride_s;           // O: sequence stride in elements
    long long o_stride_h;           // O: head stride in elements
    long long do_stride_b;          // dO: batch stride in elements
    long long do_stride_s;          // dO: sequence stride in elements
    long long do_stride_h;          // dO: head stride in elements
    long long dq_stride_b;          // dQ: batch stride in elements
    long long dq_stride_s;          // dQ: sequence stride in elements
    long long dq_stride_h;          // dQ: head stride in elements
    long long dk_stride_b;          // dK and dV: batch stride in elements
    long long dk_stride_s;          // dK and dV: sequence stride in elements
    long long dk_stride_h;          // dK and dV: head stride in elements
    int deterministic;              // 1: fixed-order dQ sums
    int nheads;                     // query heads
    int head_parts;                 // parts each kv head's group is split into (main kernel)
    int seqlen_q;                   // query rows per batch entry
    int seqlen_k;                   // key rows per batch entry
    int d;                          // head dim (a multiple of 8, at most the kernel's bucket)
    int group;                      // query heads per kv head (head h reads kv head h / group)
    int splits;                     // dQ slices (deterministic mode with dQ atomics), else 1
    int dq_accum_cols;              // row pitch of dq_accum (the head-dim bucket)
    int lanes;                      // preprocess: lanes per query row (a power of two >= d / 8)
    float softmax_scale;            // scale of S = Q K^T
    float scale_log2;               // softmax_scale * log2(e): exp(scale x) = exp2(scale_log2 x)
    int window_left;                // LOCAL masks: keys before the diagonal
    int window_right;               // LOCAL masks: keys after the diagonal (CAUSAL: its upper limit)
    const float* alibi_slopes;      // ALiBi slopes per (batch, head), float32
    float softcap_in;               // softmax_scale / softcap (0: no softcap)
    float softcap_out;              // softcap / softmax_scale
    float softcap_log2;             // softcap * log2(e) (Hopper backward: the softcap's exponent without ALiBi)
    int alibi_stride_b;             // batch stride of alibi_slopes (0: one row for all)
    float alibi_shift;              // ALiBi, dense: row i's diagonal is key i + seqlen_k - seqlen_q + alibi_shift (ring attention's blocks)
    const int* cu_seqlens_q;        // packed: cumulative query lengths (batch + 1), int32
    const int* cu_seqlens_k;        // packed: cumulative key lengths (batch + 1), int32
    int total_q;                    // packed: rows of the packed query tensor
    const int* row_block_offsets;   // packed, bulk dQ: each entry's first row block in dQ_accum (batch + 1), int32
    int ws_blocks;                  // packed, bulk dQ: row blocks per head in dQ_accum
};
static_assert(sizeof(BwdParams) == 392, "BwdParams: size differs from cuflash/_params.py");
#ifndef __CUDACC_RTC__
static_assert(__builtin_offsetof(BwdParams, q) == 0, "BwdParams.q");
static_assert(__builtin_offsetof(BwdParams, k) == 8, "BwdParams.k");
static_assert(__builtin_offsetof(BwdParams, v) == 16, "BwdParams.v");
static_assert(__builtin_offsetof(BwdParams, o) == 24, "BwdParams.o");
static_assert(__builtin_offsetof(BwdParams, dout) == 32, "BwdParams.dout");
static_assert(__builtin_offsetof(BwdParams, lse) == 40, "BwdParams.lse");
static_assert(__builtin_offsetof(BwdParams, dsum) == 48, "BwdParams.dsum");
static_assert(__builtin_offsetof(BwdParams, dq_accum) == 56, "BwdParams.dq_accum");
static_assert(__builtin_offsetof(BwdParams, dq_order) == 64, "BwdParams.dq_order");
static_assert(__builtin_offsetof(BwdParams, dq) == 72, "BwdParams.dq");
static_assert(__builtin_offsetof(BwdParams, dk) == 80, "BwdParams.dk");
static_assert(__builtin_offsetof(BwdParams, dv) == 88, "BwdParams.dv");
static_assert(__builtin_offsetof(BwdParams, q_stride_b) == 96, "BwdParams.q_stride_b");
static_assert(__builtin_offsetof(BwdParams, q_stride_s) == 104, "BwdParams.q_stride_s");
static_assert(__builtin_offsetof(BwdParams, q_stride_h) == 112, "BwdParams.q_stride_h");
static_assert(__builtin_offsetof(BwdParams, k_stride_b) == 120, "BwdParams.k_stride_b");
static_assert(__builtin_offsetof(BwdParams, k_stride_s) == 128, "BwdParams.k_stride_s");
static_assert(__builtin_offsetof(BwdParams, k_stride_h) == 136, "BwdParams.k_stride_h");
static_assert(__builtin_offsetof(BwdParams, v_stride_b) == 144, "BwdParams.v_stride_b");
static_assert(__builtin_offsetof(BwdParams, v_stride_s) == 152, "BwdParams.v_stride_s");
static_assert(__builtin_offsetof(BwdParams, v_stride_h) == 160, "BwdParams.v_stride_h");
static_assert(__builtin_offsetof(BwdParams, o_stride_b) == 168, "BwdParams.o_stride_b");
static_assert(__builtin_offsetof(BwdParams, o_stride_s) == 176, "BwdParams.o_stride_s");
static_assert(__builtin_offsetof(BwdParams, o_stride_h) == 184, "BwdParams.o_stride_h");
static_assert(__builtin_offsetof(BwdParams, do_stride_b) == 192, "BwdParams.do_stride_b");
static_assert(__builtin_offsetof(BwdParams, do_stride_s) == 200, "BwdParams.do_stride_s");
static_assert(__builtin_offsetof(BwdParams, do_stride_h) == 208, "BwdParams.do_stride_h");
static_assert(__builtin_offsetof(BwdParams, dq_stride_b) == 216, "BwdParams.dq_stride_b");
static_assert(__builtin_offsetof(BwdParams, dq_stride_s) == 224, "BwdParams.dq_stride_s");
static_assert(__builtin_offsetof(BwdParams, dq_stride_h) == 232, "BwdParams.dq_stride_h");
static_assert(__builtin_offsetof(BwdParams, dk_stride_b) == 240, "BwdParams.dk_stride_b");
static_assert(__builtin_offsetof(BwdParams, dk_stride_s) == 248, "BwdParams.dk_stride_s");
static_assert(__builtin_offsetof(BwdParams, dk_stride_h) == 256, "BwdParams.dk_stride_h");
static_assert(__builtin_offsetof(BwdParams, deterministic) == 264, "BwdParams.deterministic");
static_assert(__builtin_offsetof(BwdParams, nheads) == 268, "BwdParams.nheads");
static_assert(__builtin_offsetof(BwdParams, head_parts) == 272, "BwdParams.head_parts");
static_assert(__builtin_offsetof(BwdParams, seqlen_q) == 276, "BwdParams.seqlen_q");
static_assert(__builtin_offsetof(BwdParams, seqlen_k) == 280, "BwdParams.seqlen_k");
static_assert(__builtin_offsetof(BwdParams, d) == 284, "BwdParams.d");
static_assert(__builtin_offsetof(BwdParams, group) == 288, "BwdParams.group");
static_assert(__builtin_offsetof(BwdParams, splits) == 292, "BwdParams.splits");
static_assert(__builtin_offsetof(BwdParams, dq_accum_cols) == 296, "BwdParams.dq_accum_cols");
static_assert(__builtin_offsetof(BwdParams, lanes) == 300, "BwdParams.lanes");
static_assert(__builtin_offsetof(BwdParams, softmax_scale) == 304, "BwdParams.softmax_scale");
static_assert(__builtin_offsetof(BwdParams, scale_log2) == 308, "BwdParams.scale_log2");
static_assert(__builtin_offsetof(BwdParams, window_left) == 312, "BwdParams.window_left");
static_assert(__builtin_offsetof(BwdParams, window_right) == 316, "BwdParams.window_right");
static_assert(__builtin_offsetof(BwdParams, alibi_slopes) == 320, "BwdParams.alibi_slopes");
static_assert(__builtin_offsetof(BwdParams, softcap_in) == 328, "BwdParams.softcap_in");
static_assert(__builtin_offsetof(BwdParams, softcap_out) == 332, "BwdParams.softcap_out");
static_assert(__builtin_offsetof(BwdParams, softcap_log2) == 336, "BwdParams.softcap_log2");
static_assert(__builtin_offsetof(BwdParams, alibi_stride_b) == 340, "BwdParams.alibi_stride_b");
static_assert(__builtin_offsetof(BwdParams, alibi_shift) == 344, "BwdParams.alibi_shift");
static_assert(__builtin_offsetof(BwdParams, cu_seqlens_q) == 352, "BwdParams.cu_seqlens_q");
static_assert(__builtin_offsetof(BwdParams, cu_seqlens_k) == 360, "BwdParams.cu_seqlens_k");
static_assert(__builtin_offsetof(BwdParams, total_q) == 368, "BwdParams.total_q");
static_assert(__builtin_offsetof(BwdParams, row_block_offsets) == 376, "BwdParams.row_block_offsets");
static_assert(__builtin_offsetof(BwdParams, ws_blocks) == 384, "BwdParams.ws_blocks");
#endif

// Hopper forward kernel (fa2_forward_sm90.cu).
struct Sm90FwdParams {
    TensorMap tm_q;                 // Q's tensor map, boxes of 64 columns x 64 rows (a consumer's)
    TensorMap tm_k;                 // K's tensor map, boxes of 64 columns x B_c rows
    TensorMap tm_v;                 // V's tensor map, as K's
    const elem_t* q;                // Q (batch, seqlen_q, heads, d)
    const elem_t* k;                // K (batch, seqlen_k, heads_k, d)
    const elem_t* v;                // V, as K
    elem_t* o;                      // O, Q's shape (its own strides)
    float* lse;                     // L (batch, heads, seqlen_q), float32, contiguous; packed: (heads, total_q)
    float* o_accum;                 // FA1: O in float32 (batch, heads, seqlen_q, d)
    float* l_accum;                 // FA1: l (batch, heads, seqlen_q)
    float* m_accum;                 // FA1: m (batch, heads, seqlen_q)
    long long q_stride_b;           // Q: batch stride in elements
    long long q_stride_s;           // Q: sequence stride in elements
    long long q_stride_h;           // Q: head stride in elements
    long long k_stride_b;           // K: batch stride in elements
    long long k_stride_s;           // K: sequence stride in elements
    long long k_stride_h;           // K: head stride in elements
    long long v_stride_b;           // V: batch stride in elements
    long long v_stride_s;           // V: sequence stride in elements
    long long v_stride_h;           // V: head stride in elements
    long long o_stride_b;           // O: batch stride in elements
    long long o_stride_s;           // O: sequence stride in elements
    long long o_stride_h;           // O: head stride in elements
    int seqlen_q;                   // query rows per batch entry
    int seqlen_k;                   // key rows per batch entry
    int d;                          // head dim (a multiple of 8, at most the kernel's bucket)
    int group;                      // query heads per kv head (head h reads kv head h / group)
    float softmax_scale;            // scale of S = Q K^T
    float scale_log2;               // softmax_scale * log2(e): exp(scale x) = exp2(scale_log2 x)
    int window_left;                // LOCAL masks: keys before the diagonal
    int window_right;               // LOCAL masks: keys after the diagonal (CAUSAL: its upper limit)
    const float* alibi_slopes;      // ALiBi slopes per (batch, head), float32
    float softcap_in;               // softmax_scale / softcap (0: no softcap)
    float softcap_out;              // softcap / softmax_scale
    float softcap_log2;             // softcap * log2(e) (Hopper backward: the softcap's exponent without ALiBi)
    int alibi_stride_b;             // batch stride of alibi_slopes (0: one row for all)
    float alibi_shift;              // ALiBi, dense: row i's diagonal is key i + seqlen_k - seqlen_q + alibi_shift (ring attention's blocks)
    const int* cu_seqlens_q;        // packed: cumulative query lengths (batch + 1), int32
    const int* cu_seqlens_k;        // packed: cumulative key lengths (batch + 1), int32
    int total_q;                    // packed: rows of the packed query tensor
    int nheads;                     // query heads (the persistent grid's tiles)
    int batch;                      // batch entries (the persistent grid's tiles)
    int per_unit;                   // tiles per unit of work: 1, or 2 (causal rows T_r-1-r and r)
    unsigned heads_mul;             // FastDiv by nheads (common.cuh): multiplier
    int heads_shift;                // FastDiv by nheads: shift
    unsigned unit_rows_mul;         // FastDiv by a pair's units, ceil(T_r / per_unit): multiplier (packed batches: unused)
    int unit_rows_shift;            // FastDiv by a pair's units: shift
    int* tile_counter;              // packed: the tile scheduler's counter, int32, zero at launch
    int tail_tiles;                 // the split tail's tiles, the last ones (causal: the causal tail's units; 0: none)
    float* tail_parts;              // split tail: the split tiles' parts, float32, per boundary
    int* tail_flags;                // split tail: per boundary and warp, parts in, int32, zero between launches
};
static_assert(sizeof(Sm90FwdParams) == 704, "Sm90FwdParams: size differs from cuflash/_params.py");
#ifndef __CUDACC_RTC__
static_assert(__builtin_offsetof(Sm90FwdParams, tm_q) == 0, "Sm90FwdParams.tm_q");
static_assert(__builtin_offsetof(Sm90FwdParams, tm_k) == 128, "Sm90FwdParams.tm_k");
static_assert(__builtin_offsetof(Sm90FwdParams, tm_v) == 256, "Sm90FwdParams.tm_v");
static_assert(__builtin_offsetof(Sm90FwdParams, q) == 384, "Sm90FwdParams.q");
static_assert(__builtin_offsetof(Sm90FwdParams, k) == 392, "Sm90FwdParams.k");
static_assert(__builtin_offsetof(Sm90FwdParams, v) == 400, "Sm90FwdParams.v");
static_assert(__builtin_offsetof(Sm90FwdParams, o) == 408, "Sm90FwdParams.o");
static_assert(__builtin_offsetof(Sm90FwdParams, lse) == 416, "Sm90FwdParams.lse");
static_assert(__builtin_offsetof(Sm90FwdParams, o_accum) == 424, "Sm90FwdParams.o_accum");
static_assert(__builtin_offsetof(Sm90FwdParams, l_accum) == 432, "Sm90FwdParams.l_accum");
static_assert(__builtin_offsetof(Sm90FwdParams, m_accum) == 440, "Sm90FwdParams.m_accum");
static_assert(__builtin_offsetof(Sm90FwdParams, q_stride_b) == 448, "Sm90FwdParams.q_stride_b");
static_assert(__builtin_offsetof(Sm90FwdParams, q_stride_s) == 456, "Sm90FwdParams.q_stride_s");
static_assert(__builtin_offsetof(Sm90FwdParams, q_stride_h) == 464, "Sm90FwdParams.q_stride_h");
static_assert(__builtin_offsetof(Sm90FwdParams, k_stride_b) == 472, "Sm90FwdParams.k_stride_b");
static_assert(__builtin_offsetof(Sm90FwdParams, k_stride_s) == 480, "Sm90FwdParams.k_stride_s");
static_assert(__builtin_offsetof(Sm90FwdParams, k_stride_h) == 488, "Sm90FwdParams.k_stride_h");
static_assert(__builtin_offsetof(Sm90FwdParams, v_stride_b) == 496, "Sm90FwdParams.v_stride_b");
static_assert(__builtin_offsetof(Sm90FwdParams, v_stride_s) == 504, "Sm90FwdParams.v_stride_s");
static_assert(__builtin_offsetof(Sm90FwdParams, v_stride_h) == 512, "Sm90FwdParams.v_stride_h");
static_assert(__builtin_offsetof(Sm90FwdParams, o_stride_b) == 520, "Sm90FwdParams.o_stride_b");
static_assert(__builtin_offsetof(Sm90FwdParams, o_stride_s) == 528, "Sm90FwdParams.o_stride_s");
static_assert(__builtin_offsetof(Sm90FwdParams, o_stride_h) == 536, "Sm90FwdParams.o_stride_h");
static_assert(__builtin_offsetof(Sm90FwdParams, seqlen_q) == 544, "Sm90FwdParams.seqlen_q");
static_assert(__builtin_offsetof(Sm90FwdParams, seqlen_k) == 548, "Sm90FwdParams.seqlen_k");
static_assert(__builtin_offsetof(Sm90FwdParams, d) == 552, "Sm90FwdParams.d");
static_assert(__builtin_offsetof(Sm90FwdParams, group) == 556, "Sm90FwdParams.group");
static_assert(__builtin_offsetof(Sm90FwdParams, softmax_scale) == 560, "Sm90FwdParams.softmax_scale");
static_assert(__builtin_offsetof(Sm90FwdParams, scale_log2) == 564, "Sm90FwdParams.scale_log2");
static_assert(__builtin_offsetof(Sm90FwdParams, window_left) == 568, "Sm90FwdParams.window_left");
static_assert(__builtin_offsetof(Sm90FwdParams, window_right) == 572, "Sm90FwdParams.window_right");
static_assert(__builtin_offsetof(Sm90FwdParams, alibi_slopes) == 576, "Sm90FwdParams.alibi_slopes");
static_assert(__builtin_offsetof(Sm90FwdParams, softcap_in) == 584, "Sm90FwdParams.softcap_in");
static_assert(__builtin_offsetof(Sm90FwdParams, softcap_out) == 588, "Sm90FwdParams.softcap_out");
static_assert(__builtin_offsetof(Sm90FwdParams, softcap_log2) == 592, "Sm90FwdParams.softcap_log2");
static_assert(__builtin_offsetof(Sm90FwdParams, alibi_stride_b) == 596, "Sm90FwdParams.alibi_stride_b");
static_assert(__builtin_offsetof(Sm90FwdParams, alibi_shift) == 600, "Sm90FwdParams.alibi_shift");
static_assert(__builtin_offsetof(Sm90FwdParams, cu_seqlens_q) == 608, "Sm90FwdParams.cu_seqlens_q");
static_assert(__builtin_offsetof(Sm90FwdParams, cu_seqlens_k) == 616, "Sm90FwdParams.cu_seqlens_k");
static_assert(__builtin_offsetof(Sm90FwdParams, total_q) == 624, "Sm90FwdParams.total_q");
static_assert(__builtin_offsetof(Sm90FwdParams, nheads) == 628, "Sm90FwdParams.nheads");
static_assert(__builtin_offsetof(Sm90FwdParams, batch) == 632, "Sm90FwdParams.batch");
static_assert(__builtin_offsetof(Sm90FwdParams, per_unit) == 636, "Sm90FwdParams.per_unit");
static_assert(__builtin_offsetof(Sm90FwdParams, heads_mul) == 640, "Sm90FwdParams.heads_mul");
static_assert(__builtin_offsetof(Sm90FwdParams, heads_shift) == 644, "Sm90FwdParams.heads_shift");
static_assert(__builtin_offsetof(Sm90FwdParams, unit_rows_mul) == 648, "Sm90FwdParams.unit_rows_mul");
static_assert(__builtin_offsetof(Sm90FwdParams, unit_rows_shift) == 652, "Sm90FwdParams.unit_rows_shift");
static_assert(__builtin_offsetof(Sm90FwdParams, tile_counter) == 656, "Sm90FwdParams.tile_counter");
static_assert(__builtin_offsetof(Sm90FwdParams, tail_tiles) == 664, "Sm90FwdParams.tail_tiles");
static_assert(__builtin_offsetof(Sm90FwdParams, tail_parts) == 672, "Sm90FwdParams.tail_parts");
static_assert(__builtin_offsetof(Sm90FwdParams, tail_flags) == 680, "Sm90FwdParams.tail_flags");
#endif

// Hopper backward kernels (fa2_backward_sm90.cu).
struct Sm90BwdParams {
    TensorMap tm_q;                 // Q's tensor map, boxes of 64 columns x B_r rows
    TensorMap tm_k;                 // K's tensor map, boxes of 64 columns x B_c rows
    TensorMap tm_v;                 // V's tensor map, as K's
    TensorMap tm_do;                // dO's tensor map, as Q's
    const elem_t* q;                // Q (batch, seqlen_q, heads, d)
    const elem_t* k;                // K (batch, seqlen_k, heads_k, d)
    const elem_t* v;                // V, as K
    const elem_t* o;                // O, the forward's output (preprocess)
    const elem_t* dout;             // dO, Q's shape
    const float* lse;               // L (batch, heads, seqlen_q), float32
    float* dsum;                    // D = rowsum(dO o O) (batch, heads, seqlen_q), float32
    float* dq_accum;                // float32 dQ sums (layout: fa2_backward.cu)
    int* dq_order;                  // ordered mode: turn counters (batch, heads, T_r)
    elem_t* dq;                     // dQ, Q's shape (its own strides)
    void* dk;                       // dK: input dtype, or float32 slices (head_parts > 1)
    void* dv;                       // dV, as dK
    long long q_stride_b;           // Q: batch stride in elements
    long long q_stride_s;           // Q: sequence stride in elements
    long long q_stride_h;           // Q: head stride in elements
    long long k_stride_b;           // K: batch stride in elements
    long long k_stride_s;           // K: sequence stride in elements
    long long k_stride_h;           // K: head stride in elements
    long long v_stride_b;           // V: batch stride in elements
    long long v_stride_s;           // V: sequence stride in elements
    long long v_stride_h;           // V: head stride in elements
    long long o_stride_b;           // O: batch stride in elements
    long long o_stride_s;           // O: sequence stride in elements
    long long o_stride_h;           // O: head stride in elements
    long long do_stride_b;          // dO: batch stride in elements
    long long do_stride_s;          // dO: sequence stride in elements
    long long do_stride_h;          // dO: head stride in elements
    long long dq_stride_b;          // dQ: batch stride in elements
    long long dq_stride_s;          // dQ: sequence stride in elements
    long long dq_stride_h;          // dQ: head stride in elements
    long long dk_stride_b;          // dK and dV: batch stride in elements
    long long dk_stride_s;          // dK and dV: sequence stride in elements
    long long dk_stride_h;          // dK and dV: head stride in elements
    int deterministic;              // 1: fixed-order dQ sums
    int nheads;                     // query heads
    int head_parts;                 // parts each kv head's group is split into (main kernel)
    int seqlen_q;                   // query rows per batch entry
    int seqlen_k;                   // key rows per batch entry
    int d;                          // head dim (a multiple of 8, at most the kernel's bucket)
    int group;                      // query heads per kv head (head h reads kv head h / group)
    int splits;                     // dQ slices (deterministic mode with dQ atomics), else 1
    int dq_accum_cols;              // row pitch of dq_accum (the head-dim bucket)
    int lanes;                      // preprocess: lanes per query row (a power of two >= d / 8)
    float softmax_scale;            // scale of S = Q K^T
    float scale_log2;               // softmax_scale * log2(e): exp(scale x) = exp2(scale_log2 x)
    int window_left;                // LOCAL masks: keys before the diagonal
    int window_right;               // LOCAL masks: keys after the diagonal (CAUSAL: its upper limit)
    const float* alibi_slopes;      // ALiBi slopes per (batch, head), float32
    float softcap_in;               // softmax_scale / softcap (0: no softcap)
    float softcap_out;              // softcap / softmax_scale
    float softcap_log2;             // softcap * log2(e) (Hopper backward: the softcap's exponent without ALiBi)
    int alibi_stride_b;             // batch stride of alibi_slopes (0: one row for all)
    float alibi_shift;              // ALiBi, dense: row i's diagonal is key i + seqlen_k - seqlen_q + alibi_shift (ring attention's blocks)
    const int* cu_seqlens_q;        // packed: cumulative query lengths (batch + 1), int32
    const int* cu_seqlens_k;        // packed: cumulative key lengths (batch + 1), int32
    int total_q;                    // packed: rows of the packed query tensor
    const int* row_block_offsets;   // packed, bulk dQ: each entry's first row block in dQ_accum (batch + 1), int32
    int ws_blocks;                  // packed, bulk dQ: row blocks per head in dQ_accum
    float* lse_log2;                // L log2(e) (batch, heads, seqlen_q rounded up to B_r), float32, +inf past the end of Q (preprocess with PAD; dsum is padded alike)
    int tail_whole;                 // the tiles not split (dense, no mask: the 1-d grid's first blocks, a tile each)
    int tail_parts;                 // split tail: parts of each tile from tail_whole on (1: none)
    float* tail_acc;                // split tail: the split tiles' dK, dV sums, float32, zero between launches
    int* tail_flags;                // split tail: per split tile and consumer warp, parts in, int32, zero between launches
};
static_assert(sizeof(Sm90BwdParams) == 960, "Sm90BwdParams: size differs from cuflash/_params.py");
#ifndef __CUDACC_RTC__
static_assert(__builtin_offsetof(Sm90BwdParams, tm_q) == 0, "Sm90BwdParams.tm_q");
static_assert(__builtin_offsetof(Sm90BwdParams, tm_k) == 128, "Sm90BwdParams.tm_k");
static_assert(__builtin_offsetof(Sm90BwdParams, tm_v) == 256, "Sm90BwdParams.tm_v");
static_assert(__builtin_offsetof(Sm90BwdParams, tm_do) == 384, "Sm90BwdParams.tm_do");
static_assert(__builtin_offsetof(Sm90BwdParams, q) == 512, "Sm90BwdParams.q");
static_assert(__builtin_offsetof(Sm90BwdParams, k) == 520, "Sm90BwdParams.k");
static_assert(__builtin_offsetof(Sm90BwdParams, v) == 528, "Sm90BwdParams.v");
static_assert(__builtin_offsetof(Sm90BwdParams, o) == 536, "Sm90BwdParams.o");
static_assert(__builtin_offsetof(Sm90BwdParams, dout) == 544, "Sm90BwdParams.dout");
static_assert(__builtin_offsetof(Sm90BwdParams, lse) == 552, "Sm90BwdParams.lse");
static_assert(__builtin_offsetof(Sm90BwdParams, dsum) == 560, "Sm90BwdParams.dsum");
static_assert(__builtin_offsetof(Sm90BwdParams, dq_accum) == 568, "Sm90BwdParams.dq_accum");
static_assert(__builtin_offsetof(Sm90BwdParams, dq_order) == 576, "Sm90BwdParams.dq_order");
static_assert(__builtin_offsetof(Sm90BwdParams, dq) == 584, "Sm90BwdParams.dq");
static_assert(__builtin_offsetof(Sm90BwdParams, dk) == 592, "Sm90BwdParams.dk");
static_assert(__builtin_offsetof(Sm90BwdParams, dv) == 600, "Sm90BwdParams.dv");
static_assert(__builtin_offsetof(Sm90BwdParams, q_stride_b) == 608, "Sm90BwdParams.q_stride_b");
static_assert(__builtin_offsetof(Sm90BwdParams, q_stride_s) == 616, "Sm90BwdParams.q_stride_s");
static_assert(__builtin_offsetof(Sm90BwdParams, q_stride_h) == 624, "Sm90BwdParams.q_stride_h");
static_assert(__builtin_offsetof(Sm90BwdParams, k_stride_b) == 632, "Sm90BwdParams.k_stride_b");
static_assert(__builtin_offsetof(Sm90BwdParams, k_stride_s) == 640, "Sm90BwdParams.k_stride_s");
static_assert(__builtin_offsetof(Sm90BwdParams, k_stride_h) == 648, "Sm90BwdParams.k_stride_h");
static_assert(__builtin_offsetof(Sm90BwdParams, v_stride_b) == 656, "Sm90BwdParams.v_stride_b");
static_assert(__builtin_offsetof(Sm90BwdParams, v_stride_s) == 664, "Sm90BwdParams.v_stride_s");
static_assert(__builtin_offsetof(Sm90BwdParams, v_stride_h) == 672, "Sm90BwdParams.v_stride_h");
static_assert(__builtin_offsetof(Sm90BwdParams, o_stride_b) == 680, "Sm90BwdParams.o_stride_b");
static_assert(__builtin_offsetof(Sm90BwdParams, o_stride_s) == 688, "Sm90BwdParams.o_stride_s");
static_assert(__builtin_offsetof(Sm90BwdParams, o_stride_h) == 696, "Sm90BwdParams.o_stride_h");
static_assert(__builtin_offsetof(Sm90BwdParams, do_stride_b) == 704, "Sm90BwdParams.do_stride_b");
static_assert(__builtin_offsetof(Sm90BwdParams, do_stride_s) == 712, "Sm90BwdParams.do_stride_s");
static_assert(__builtin_offsetof(Sm90BwdParams, do_stride_h) == 720, "Sm90BwdParams.do_stride_h");
static_assert(__builtin_offsetof(Sm90BwdParams, dq_stride_b) == 728, "Sm90BwdParams.dq_stride_b");
static_assert(__builtin_offsetof(Sm90BwdParams, dq_stride_s) == 736, "Sm90BwdParams.dq_stride_s");
static_assert(__builtin_offsetof(Sm90BwdParams, dq_stride_h) == 744, "Sm90BwdParams.dq_stride_h");
static_assert(__builtin_offsetof(Sm90BwdParams, dk_stride_b) == 752, "Sm90BwdParams.dk_stride_b");
static_assert(__builtin_offsetof(Sm90BwdParams, dk_stride_s) == 760, "Sm90BwdParams.dk_stride_s");
static_assert(__builtin_offsetof(Sm90BwdParams, dk_stride_h) == 768, "Sm90BwdParams.dk_stride_h");
static_assert(__builtin_offsetof(Sm90BwdParams, deterministic) == 776, "Sm90BwdParams.deterministic");
static_assert(__builtin_offsetof(Sm90BwdParams, nheads) == 780, "Sm90BwdParams.nheads");
static_assert(__builtin_offsetof(Sm90BwdParams, head_parts) == 784, "Sm90BwdParams.head_parts");
static_assert(__builtin_offsetof(Sm90BwdParams, seqlen_q) == 788, "Sm90BwdParams.seqlen_q");
static_assert(__builtin_offsetof(Sm90BwdParams, seqlen_k) == 792, "Sm90BwdParams.seqlen_k");
static_assert(__builtin_offsetof(Sm90BwdParams, d) == 796, "Sm90BwdParams.d");
static_assert(__builtin_offsetof(Sm90BwdParams, group) == 800, "Sm90BwdParams.group");
static_assert(__builtin_offsetof(Sm90BwdParams, splits) == 804, "Sm90BwdParams.splits");
static_assert(__builtin_offsetof(Sm90BwdParams, dq_accum_cols) == 808, "Sm90BwdParams.dq_accum_cols");
static_assert(__builtin_offsetof(Sm90BwdParams, lanes) == 812, "Sm90BwdParams.lanes");
static_assert(__builtin_offsetof(Sm90BwdParams, softmax_scale) == 816, "Sm90BwdParams.softmax_scale");
static_assert(__builtin_offsetof(Sm90BwdParams, scale_log2) == 820, "Sm90BwdParams.scale_log2");
static_assert(__builtin_offsetof(Sm90BwdParams, window_left) == 824, "Sm90BwdParams.window_left");
static_assert(__builtin_offsetof(Sm90BwdParams, window_right) == 828, "Sm90BwdParams.window_right");
static_assert(__builtin_offsetof(Sm90BwdParams, alibi_slopes) == 832, "Sm90BwdParams.alibi_slopes");
static_assert(__builtin_offsetof(Sm90BwdParams, softcap_in) == 840, "Sm90BwdParams.softcap_in");
static_assert(__builtin_offsetof(Sm90BwdParams, softcap_out) == 844, "Sm90BwdParams.softcap_out");
static_assert(__builtin_offsetof(Sm90BwdParams, softcap_log2) == 848, "Sm90BwdParams.softcap_log2");
static_assert(__builtin_offsetof(Sm90BwdParams, alibi_stride_b) == 852, "Sm90BwdParams.alibi_stride_b");
static_assert(__builtin_offsetof(Sm90BwdParams, alibi_shift) == 856, "Sm90BwdParams.alibi_shift");
static_assert(__builtin_offsetof(Sm90BwdParams, cu_seqlens_q) == 864, "Sm90BwdParams.cu_seqlens_q");
static_assert(__builtin_offsetof(Sm90BwdParams, cu_seqlens_k) == 872, "Sm90BwdParams.cu_seqlens_k");
static_assert(__builtin_offsetof(Sm90BwdParams, total_q) == 880, "Sm90BwdParams.total_q");
static_assert(__builtin_offsetof(Sm90BwdParams, row_block_offsets) == 888, "Sm90BwdParams.row_block_offsets");
static_assert(__builtin_offsetof(Sm90BwdParams, ws_blocks) == 896, "Sm90BwdParams.ws_blocks");
static_assert(__builtin_offsetof(Sm90BwdParams, lse_log2) == 904, "Sm90BwdParams.lse_log2");
static_assert(__builtin_offsetof(Sm90BwdParams, tail_whole) == 912, "Sm90BwdParams.tail_whole");
static_assert(__builtin_offsetof(Sm90BwdParams, tail_parts) == 916, "Sm90BwdParams.tail_parts");
static_assert(__builtin_offsetof(Sm90BwdParams, tail_acc) == 920, "Sm90BwdParams.tail_acc");
static_assert(__builtin_offsetof(Sm90BwdParams, tail_flags) == 928, "Sm90BwdParams.tail_flags");
#endif

// KV-cache decoding kernels (fa2_decode.cu).
struct DecodeParams {
    const elem_t* q;                // Q (batch, seqlen_q, heads, d)
    elem_t* k;                      // K cache: (batch, capacity, heads_k, d), or paged (num_pages, page_size, heads_k, d); the append writes into it
    elem_t* v;                      // V cache, as K
    elem_t* o;                      // O, Q's shape (its own strides)
    float* lse;                     // L (batch, heads, seqlen_q), float32, contiguous
    float* o_partial;               // split-KV: O_s (splits, batch, heads, seqlen_q, d), float32
    float* lse_partial;             // split-KV: L_s (splits, batch, heads, seqlen_q), float32
    const elem_t* k_new;            // append: new keys (batch, seqlen_new, heads_k, d)
    const elem_t* v_new;            // append: new values, as k_new
    const int* cache_seqlens;       // keys already in each entry's cache (batch,), int32
    const int* block_table;         // paged: pages of each entry (batch, pages per entry), int32; null: contiguous
    long long q_stride_b;           // Q: batch stride in elements
    long long q_stride_s;           // Q: sequence stride in elements
    long long q_stride_h;           // Q: head stride in elements
    long long k_stride_b;           // the K cache (b: batch, or page when paged): batch stride in elements
    long long k_stride_s;           // the K cache (b: batch, or page when paged): sequence stride in elements
    long long k_stride_h;           // the K cache (b: batch, or page when paged): head stride in elements
    long long v_stride_b;           // the V cache, as K's: batch stride in elements
    long long v_stride_s;           // the V cache, as K's: sequence stride in elements
    long long v_stride_h;           // the V cache, as K's: head stride in elements
    long long o_stride_b;           // O: batch stride in elements
    long long o_stride_s;           // O: sequence stride in elements
    long long o_stride_h;           // O: head stride in elements
    long long kn_stride_b;          // k_new: batch stride in elements
    long long kn_stride_s;          // k_new: sequence stride in elements
    long long kn_stride_h;          // k_new: head stride in elements
    long long vn_stride_b;          // v_new: batch stride in elements
    long long vn_stride_s;          // v_new: sequence stride in elements
    long long vn_stride_h;          // v_new: head stride in elements
    int seqlen_q;                   // query rows per batch entry
    int seqlen_new;                 // keys appended per entry (0: none)
    int d;                          // head dim (a multiple of 8, at most the kernel's bucket)
    int group;                      // query heads per kv head (head h reads kv head h / group)
    int pack;                       // query heads packed into one tile's rows: group, or 1 (ALiBi)
    int row_tiles;                  // tiles of 16 packed rows per group of pack heads
    int nheads;                     // query heads
    int batch;                      // batch entries
    int num_splits;                 // splits of each entry's key range (1: no partials)
    int page_size;                  // paged: keys per page
    int block_table_stride;         // paged: the block table's row stride
    float softmax_scale;            // scale of S = Q K^T
    float scale_log2;               // softmax_scale * log2(e): exp(scale x) = exp2(scale_log2 x)
    int window_left;                // LOCAL masks: keys before the diagonal
    int window_right;               // LOCAL masks: keys after the diagonal (CAUSAL: its upper limit)
    const float* alibi_slopes;      // ALiBi slopes per (batch, head), float32
    float softcap_in;               // softmax_scale / softcap (0: no softcap)
    float softcap_out;              // softcap / softmax_scale
    float softcap_log2;             // softcap * log2(e) (Hopper backward: the softcap's exponent without ALiBi)
    int alibi_stride_b;             // batch stride of alibi_slopes (0: one row for all)
    float alibi_shift;              // ALiBi, dense: row i's diagonal is key i + seqlen_k - seqlen_q + alibi_shift (ring attention's blocks)
};
static_assert(sizeof(DecodeParams) == 328, "DecodeParams: size differs from cuflash/_params.py");
#ifndef __CUDACC_RTC__
static_assert(__builtin_offsetof(DecodeParams, q) == 0, "DecodeParams.q");
static_assert(__builtin_offsetof(DecodeParams, k) == 8, "DecodeParams.k");
static_assert(__builtin_offsetof(DecodeParams, v) == 16, "DecodeParams.v");
static_assert(__builtin_offsetof(DecodeParams, o) == 24, "DecodeParams.o");
static_assert(__builtin_offsetof(DecodeParams, lse) == 32, "DecodeParams.lse");
static_assert(__builtin_offsetof(DecodeParams, o_partial) == 40, "DecodeParams.o_partial");
static_assert(__builtin_offsetof(DecodeParams, lse_partial) == 48, "DecodeParams.lse_partial");
static_assert(__builtin_offsetof(DecodeParams, k_new) == 56, "DecodeParams.k_new");
static_assert(__builtin_offsetof(DecodeParams, v_new) == 64, "DecodeParams.v_new");
static_assert(__builtin_offsetof(DecodeParams, cache_seqlens) == 72, "DecodeParams.cache_seqlens");
static_assert(__builtin_offsetof(DecodeParams, block_table) == 80, "DecodeParams.block_table");
static_assert(__builtin_offsetof(DecodeParams, q_stride_b) == 88, "DecodeParams.q_stride_b");
static_assert(__builtin_offsetof(DecodeParams, q_stride_s) == 96, "DecodeParams.q_stride_s");
static_assert(__builtin_offsetof(DecodeParams, q_stride_h) == 104, "DecodeParams.q_stride_h");
static_assert(__builtin_offsetof(DecodeParams, k_stride_b) == 112, "DecodeParams.k_stride_b");
static_assert(__builtin_offsetof(DecodeParams, k_stride_s) == 120, "DecodeParams.k_stride_s");
static_assert(__builtin_offsetof(DecodeParams, k_stride_h) == 128, "DecodeParams.k_stride_h");
static_assert(__builtin_offsetof(DecodeParams, v_stride_b) == 136, "DecodeParams.v_stride_b");
static_assert(__builtin_offsetof(DecodeParams, v_stride_s) == 144, "DecodeParams.v_stride_s");
static_assert(__builtin_offsetof(DecodeParams, v_stride_h) == 152, "DecodeParams.v_stride_h");
static_assert(__builtin_offsetof(DecodeParams, o_stride_b) == 160, "DecodeParams.o_stride_b");
static_assert(__builtin_offsetof(DecodeParams, o_stride_s) == 168, "DecodeParams.o_stride_s");
static_assert(__builtin_offsetof(DecodeParams, o_stride_h) == 176, "DecodeParams.o_stride_h");
static_assert(__builtin_offsetof(DecodeParams, kn_stride_b) == 184, "DecodeParams.kn_stride_b");
static_assert(__builtin_offsetof(DecodeParams, kn_stride_s) == 192, "DecodeParams.kn_stride_s");
static_assert(__builtin_offsetof(DecodeParams, kn_stride_h) == 200, "DecodeParams.kn_stride_h");
static_assert(__builtin_offsetof(DecodeParams, vn_stride_b) == 208, "DecodeParams.vn_stride_b");
static_assert(__builtin_offsetof(DecodeParams, vn_stride_s) == 216, "DecodeParams.vn_stride_s");
static_assert(__builtin_offsetof(DecodeParams, vn_stride_h) == 224, "DecodeParams.vn_stride_h");
static_assert(__builtin_offsetof(DecodeParams, seqlen_q) == 232, "DecodeParams.seqlen_q");
static_assert(__builtin_offsetof(DecodeParams, seqlen_new) == 236, "DecodeParams.seqlen_new");
static_assert(__builtin_offsetof(DecodeParams, d) == 240, "DecodeParams.d");
static_assert(__builtin_offsetof(DecodeParams, group) == 244, "DecodeParams.group");
static_assert(__builtin_offsetof(DecodeParams, pack) == 248, "DecodeParams.pack");
static_assert(__builtin_offsetof(DecodeParams, row_tiles) == 252, "DecodeParams.row_tiles");
static_assert(__builtin_offsetof(DecodeParams, nheads) == 256, "DecodeParams.nheads");
static_assert(__builtin_offsetof(DecodeParams, batch) == 260, "DecodeParams.batch");
static_assert(__builtin_offsetof(DecodeParams, num_splits) == 264, "DecodeParams.num_splits");
static_assert(__builtin_offsetof(DecodeParams, page_size) == 268, "DecodeParams.page_size");
static_assert(__builtin_offsetof(DecodeParams, block_table_stride) == 272, "DecodeParams.block_table_stride");
static_assert(__builtin_offsetof(DecodeParams, softmax_scale) == 276, "DecodeParams.softmax_scale");
static_assert(__builtin_offsetof(DecodeParams, scale_log2) == 280, "DecodeParams.scale_log2");
static_assert(__builtin_offsetof(DecodeParams, window_left) == 284, "DecodeParams.window_left");
static_assert(__builtin_offsetof(DecodeParams, window_right) == 288, "DecodeParams.window_right");
static_assert(__builtin_offsetof(DecodeParams, alibi_slopes) == 296, "DecodeParams.alibi_slopes");
static_assert(__builtin_offsetof(DecodeParams, softcap_in) == 304, "DecodeParams.softcap_in");
static_assert(__builtin_offsetof(DecodeParams, softcap_out) == 308, "DecodeParams.softcap_out");
static_assert(__builtin_offsetof(DecodeParams, softcap_log2) == 312, "DecodeParams.softcap_log2");
static_assert(__builtin_offsetof(DecodeParams, alibi_stride_b) == 316, "DecodeParams.alibi_stride_b");
static_assert(__builtin_offsetof(DecodeParams, alibi_shift) == 320, "DecodeParams.alibi_shift");
#endif

}  // namespace cuflash
