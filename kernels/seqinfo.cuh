// seqinfo.cuh: where one batch entry's rows are, and how many there are.
//
// Every kernel asks SeqInfo for the rows of its batch entry instead of computing
// batch * stride itself, so that variable-length batches (rows packed back to back, located by
// cumulative sequence lengths) change this file and nowhere else. Today every entry has
// seqlen_q query rows and seqlen_k key rows, at batch * stride_b.
#pragma once

namespace cuflash {

struct SeqInfo {
    int batch;     // the batch entry
    int seqlen_q;  // its query rows
    int seqlen_k;  // its key rows

    // Element offset of the entry's row 0 in a query-side tensor (Q, O, dO, dQ) with batch
    // stride stride_b and row stride stride_s.
    __device__ __forceinline__ long long q_offset(long long stride_b,
                                                  long long /*stride_s*/) const {
        return batch * stride_b;
    }
    // The same in a key-side tensor (K, V, dK, dV).
    __device__ __forceinline__ long long k_offset(long long stride_b,
                                                  long long /*stride_s*/) const {
        return batch * stride_b;
    }
    // TMA coordinates (4-d tensor maps over (d, seqlen, heads, batch)) of the entry's row 0 in
    // a query-side and a key-side tensor: its row and batch coordinates.
    __device__ __forceinline__ int q_row0() const { return 0; }
    __device__ __forceinline__ int q_batch() const { return batch; }
    __device__ __forceinline__ int k_row0() const { return 0; }
    __device__ __forceinline__ int k_batch() const { return batch; }
    // Element offset of (the entry, head, row 0) in a float32 row vector (batch, heads,
    // seqlen_q): L and D.
    __device__ __forceinline__ long long row_vector(int head, int nheads) const {
        return ((long long)batch * nheads + head) * seqlen_q;
    }
};

template <class Params>
__device__ __forceinline__ SeqInfo seq_info(const Params& p, int batch) {
    return {batch, p.seqlen_q, p.seqlen_k};
}

}  // namespace cuflash
