// seqinfo.cuh: where one batch entry's rows are, and how many there are.
//
// Every kernel asks SeqInfo for the rows of its batch entry instead of computing
// batch * stride itself, so that variable-length batches change this file and nowhere else.
// Two layouts:
//   dense:  every entry has seqlen_q query rows and seqlen_k key rows, at batch * stride_b;
//   packed (variable length, the PackedSeq kernels, cu_seqlens_q / cu_seqlens_k):
//           the entries' rows lie back to back in one (total, heads, d) tensor; entry b's query
//           rows are [cu_seqlens_q[b], cu_seqlens_q[b + 1]), its key rows likewise, and L is
//           (heads, total_q). seqlen_q and seqlen_k in the parameters are then the longest
//           entry's (the grid's size), and each entry's own come from here.
#pragma once

namespace cuflash {

struct SeqInfo {
    int batch;     // the batch entry
    int seqlen_q;  // its query rows
    int seqlen_k;  // its key rows
    int start_q;   // packed: its first row in the packed query tensor; dense: -1
    int start_k;   // packed: its first row in the packed key tensor
    int total_q;   // packed: rows of the packed query tensor (L's head stride)

    __device__ __forceinline__ bool packed() const { return start_q >= 0; }
    // Element offset of the entry's row 0 in a query-side tensor (Q, O, dO, dQ) with batch
    // stride stride_b and row stride stride_s.
    __device__ __forceinline__ long long q_offset(long long stride_b, long long stride_s) const {
        return packed() ? start_q * stride_s : batch * stride_b;
    }
    // The same in a key-side tensor (K, V, dK, dV).
    __device__ __forceinline__ long long k_offset(long long stride_b, long long stride_s) const {
        return packed() ? start_k * stride_s : batch * stride_b;
    }
    // TMA coordinates (4-d tensor maps over (d, seqlen, heads, batch); packed: over (d, total,
    // heads, 1)) of the entry's row 0 in a query-side and a key-side tensor.
    __device__ __forceinline__ int q_row0() const { return packed() ? start_q : 0; }
    __device__ __forceinline__ int q_batch() const { return packed() ? 0 : batch; }
    __device__ __forceinline__ int k_row0() const { return packed() ? start_k : 0; }
    __device__ __forceinline__ int k_batch() const { return packed() ? 0 : batch; }
    // Element offset of (the entry, head, row 0) in a float32 row vector: L and D, (batch,
    // heads, seqlen_q); packed: (heads, total_q).
    __device__ __forceinline__ long long row_vector(int head, int nheads) const {
        return packed() ? (long long)head * total_q + start_q
                        : ((long long)batch * nheads + head) * seqlen_q;
    }
};

// The two layouts, a kernel's template argument (SeqT), so that a dense kernel keeps its code and
// its registers (the packed entry's lengths and offsets come from global loads and stay live):
struct DenseSeq {
    static constexpr bool PACKED = false;
    template <class Params>
    static __device__ __forceinline__ SeqInfo info(const Params& p, int batch) {
        return {batch, p.seqlen_q, p.seqlen_k, -1, -1, 0};
    }
};
// (params with the packed fields: FwdParams, Sm90FwdParams, BwdParams)
struct PackedSeq {
    static constexpr bool PACKED = true;
    template <class Params>
    static __device__ __forceinline__ SeqInfo info(const Params& p, int batch) {
        const int q0 = p.cu_seqlens_q[batch], k0 = p.cu_seqlens_k[batch];
        return {batch, p.cu_seqlens_q[batch + 1] - q0, p.cu_seqlens_k[batch + 1] - k0, q0, k0,
                p.total_q};
    }
};

// A packed batch's row blocks of B_r rows, numbered without gaps: entry by entry, an entry's
// heads one after the other, a head's row blocks in order. find(u) gives unit u's (head, row
// block) and leaves `entry` and its T_r on u's entry. For a scheduler that hands out units
// in increasing order (fa2_forward_sm90.cu): the walk only moves on, over the entries between
// two units (zero-length entries have no units).
template <int B_r>
struct PackedUnits {
    int entry = 0, first = 0, T_r = 0;  // the walk's entry, its first unit, its row blocks

    template <class Params>
    __device__ __forceinline__ bool find(const Params& p, int u, int& head, int& block) {
        for (; entry < p.batch; ++entry, first += T_r * p.nheads) {
            T_r = (p.cu_seqlens_q[entry + 1] - p.cu_seqlens_q[entry] + B_r - 1) / B_r;
            if (u < first + T_r * p.nheads) {
                head = (u - first) / T_r;
                block = (u - first) % T_r;
                return true;
            }
        }
        T_r = 0;
        return false;  // (past the last unit)
    }
};

// The dense layout, for the kernels that have no other (FlashAttention-1).
template <class Params>
__device__ __forceinline__ SeqInfo seq_info(const Params& p, int batch) {
    return DenseSeq::info(p, batch);
}

}  // namespace cuflash
