// fa1_forward.cu: FlashAttention-1 forward (Algorithm 1 of the FlashAttention paper, as the
// seed document's section 1.4 lays it out), on the same tensor-core primitives as the FA2
// kernels so that comparing the two measures the algorithm, not the instructions.
//
//   one thread block per (head, batch)                       FA1 parallelises over b and h only
//   for each column block j:                                 outer loop
//       K_j, V_j: HBM -> shared memory, once
//       for each row block i that sees column block j:       inner loop
//           Q_i: HBM -> shared memory;  O_i, l_i, m_i: read from HBM
//           S_ij    = Q_i K_j^T
//           m~_ij   = rowmax(S_ij),  P~_ij = exp(S_ij - m~_ij),  l~_ij = rowsum(P~_ij)
//           m_new   = max(m_i, m~_ij)
//           l_new   = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
//           O_i     = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
//           O_i, l_new, m_new: written back to HBM
//
// O_i stays normalised after every step (FA2 instead keeps O~ unscaled and divides once), and
// O, l, m make a round trip through HBM at every inner step (FA2 keeps them in registers).
// O lives in a float32 workspace (batch, heads, seqlen_q, d) so that the repeated rescaling
// does not also round to 16 bits at every step; fa1_finalize casts it and writes L = m + log l.
// Causal: row blocks entirely above the diagonal of column block j are skipped, the mask is
// applied only on blocks that cross it (block_range.cuh, shared with the FA2 kernels).
//
// Block sizes follow the seed: B_c = ceil(M / 4d), B_r = min(B_c, d), M the shared memory a
// thread block may use (cuflash/_plan.py, fa1_config), rounded to tensor-core tiles. Each of
// the B_r / 16 warps owns 16 rows of Q_i, O_i, l_i, m_i.
#include "common.cuh"
#include "params.cuh"
#include "seqinfo.cuh"
#include "mask.cuh"
#include "block_range.cuh"
#include "score.cuh"

namespace cuflash {

// Tile shape (cuflash/_plan.py, fa1_config): B_r query rows, B_c keys, head-dim bucket HD.
template <int HD_, int B_r_, int B_c_>
struct Fa1Tile {
    static constexpr int HD = HD_, B_r = B_r_, B_c = B_c_;
    static constexpr int NWARPS = B_r / 16, NTHREADS = NWARPS * 32;  // 16 rows per warp
    // Q_i (B_r x HD), K_j, V_j (B_c x HD each), 16-bit (FA1Config.smem_bytes)
    static constexpr int SMEM_BYTES = 2 * (B_r + 2 * B_c) * HD;
    static_assert(B_r % 16 == 0 && B_c % 16 == 0 && HD % 32 == 0, "tensor-core tiles");
};

template <typename T, typename Tile, typename MaskT>
__global__ void __launch_bounds__(Tile::NTHREADS, 1)
fa1_forward(const FwdParams p) {
    constexpr int HD = Tile::HD, B_r = Tile::B_r, B_c = Tile::B_c;
    const ScoreScale score(p);  // the score hook (score.cuh): the scale in the exponent
    const float softmax_scale = score.lse_scale, scale_log2 = score.exp2_scale;
    constexpr int NTHREADS = Tile::NTHREADS;
    constexpr int NT_S = B_c / 8, NT_O = HD / 8;

    extern __shared__ __attribute__((aligned(128))) elem_t smem[];
    elem_t* sQ = smem;           // (B_r, HD)  Q_i
    elem_t* sK = sQ + B_r * HD;  // (B_c, HD)  K_j
    elem_t* sV = sK + B_c * HD;  // (B_c, HD)  V_j

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int head = blockIdx.x, batch = blockIdx.y, nheads = gridDim.x;
    const int head_k = head / p.group;
    const SeqInfo seq = seq_info(p, batch);  // this batch entry's rows
    const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k, d = p.d;
    const MaskT mask(p, seqlen_q, seqlen_k);
    const int chunks = d / 8;
    const long long q_stride_s = p.q_stride_s, k_stride_s = p.k_stride_s, v_stride_s = p.v_stride_s;
    const elem_t* q = p.q + seq.q_offset(p.q_stride_b, q_stride_s) + head * p.q_stride_h;
    const elem_t* k = p.k + seq.k_offset(p.k_stride_b, k_stride_s) + head_k * p.k_stride_h;
    const elem_t* v = p.v + seq.k_offset(p.v_stride_b, v_stride_s) + head_k * p.v_stride_h;
    // O, l, m of this (batch, head) in HBM (fa1_finalize reads them back)
    float* o_hbm = p.o_accum + seq.row_vector(head, nheads) * d;
    float* l_hbm = p.l_accum + seq.row_vector(head, nheads);
    float* m_hbm = p.m_accum + seq.row_vector(head, nheads);

    const SwizzledReader<HD> readQ(smem_u32(sQ) + warp * 16 * HD * 2, lane_row_rows_first(lane),
                                   lane_chunk_rows_first(lane));
    const SwizzledReader<HD> readK(smem_u32(sK), lane_row_chunks_first(lane),
                                   lane_chunk_chunks_first(lane));
    const SwizzledReader<HD> readV(smem_u32(sV), lane_row_rows_first(lane),
                                   lane_chunk_rows_first(lane));

    const int T_c = (seqlen_k + B_c - 1) / B_c;
    for (int j = 0; j < T_c; ++j) {  // ---- outer loop: column blocks --------------------------
        const int col0 = j * B_c;
        __syncthreads();  // every warp is done with K_{j-1}, V_{j-1}
        load_tile_async<B_c, HD, NTHREADS>(sK, k + col0 * k_stride_s, k_stride_s,
                                           seqlen_k - col0, chunks, tid);
        load_tile_async<B_c, HD, NTHREADS>(sV, v + col0 * v_stride_s, v_stride_s,
                                           seqlen_k - col0, chunks, tid);
        cp_async_commit();
        const RowBlocks rb = row_blocks<B_r, B_c>(mask, j);

        for (int i = rb.begin; i < rb.end; ++i) {  // ---- inner loop: row blocks ------------
            const int row0 = i * B_r;
            __syncthreads();  // every warp is done with Q_{i-1}
            load_tile_async<B_r, HD, NTHREADS>(sQ, q + row0 * q_stride_s, q_stride_s,
                                               seqlen_q - row0, chunks, tid);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();  // Q_i (and K_j, V_j) are in shared memory

            // S_ij = Q_i K_j^T: (16 x B_c) per warp (one m16 tile: s_tiles[0]).
            float s_tiles[1][NT_S][4];
            float (&s)[NT_S][4] = s_tiles[0];
            zero(s_tiles);
            warp_mma<T, HD / 16, false>(  // k step kk = head-dim chunks 2 kk
                s_tiles,
                [&](unsigned (&a)[4], int, int kk, int) { ldmatrix_x4(a, readQ.at(0, 2 * kk)); },
                [&](unsigned (&b)[4], int nt2, int kk, int) {
                    ldmatrix_x4(b, readK.at(nt2 * 16, 2 * kk));
                });
            if constexpr (ScoreScale::REWRITES) {  // the score hook (score.cuh)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float dist = score.template diagonal<false>(
                        p, row0 + warp * 16 + lane / 4 + (e / 2) * 8, col0 + (lane % 4) * 2,
                        seqlen_q, seqlen_k);
#pragma unroll
                    for (int nt = 0; nt < NT_S; ++nt)
                        s[nt][e] = score.apply(p, s[nt][e],
                                               dist - static_cast<float>(nt * 8 + e % 2));
                }
            }
            // S_ij[r, c] = -inf where key c is not visible from query r (mask.cuh)
            if (block_needs_mask<B_r, B_c>(mask, i, j))
                mask_fragment(mask, s, row0 + warp * 16 + lane / 4, col0, lane);

            // m~_ij = rowmax(S_ij) (scaled, natural units), P~_ij = exp(S_ij - m~_ij),
            // l~_ij = rowsum(P~_ij).
            float m_tilde[2], l_tilde[2];
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                float mx = CUFLASH_NEG_INF;
#pragma unroll
                for (int nt = 0; nt < NT_S; ++nt)
                    mx = fmaxf(mx, fmaxf(s[nt][e2 * 2], s[nt][e2 * 2 + 1]));
                mx = quad_max(mx);
                const float mx_log2 = mx == CUFLASH_NEG_INF ? 0.f : mx * scale_log2;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
                    for (int e1 = 0; e1 < 2; ++e1) {
                        float& x = s[nt][e2 * 2 + e1];
                        x = exp2_approx(fmaf(x, scale_log2, -mx_log2));
                        sum += x;
                    }
                m_tilde[e2] = mx == CUFLASH_NEG_INF ? CUFLASH_NEG_INF : mx * softmax_scale;
                l_tilde[e2] = quad_sum(sum);
            }

            // P~_ij V_j: (16 x HD) per warp, P~ from registers as the A operand.
            float pv_tiles[1][NT_O][4];
            float (&pv)[NT_O][4] = pv_tiles[0];
            zero(pv_tiles);
            warp_mma<T, B_c / 16, false>(  // k step kk = keys 16 kk
                pv_tiles,
                [&](unsigned (&p)[4], int, int kk, int) { pack_a_fragment<T>(p, s, kk); },
                [&](unsigned (&b)[4], int nd2, int kk, int) {
                    ldmatrix_x4_trans(b, readV.at(kk * 16, nd2 * 2));
                });

            // The HBM round trip: read O_i, l_i, m_i, rescale, write them back.
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                const int row = row0 + warp * 16 + lane / 4 + e2 * 8;
                const bool valid = row < seqlen_q;
                const float m_i = valid ? m_hbm[row] : CUFLASH_NEG_INF;
                const float l_i = valid ? l_hbm[row] : 0.f;
                const float m_new = fmaxf(m_i, m_tilde[e2]);
                const float m_safe = m_new == CUFLASH_NEG_INF ? 0.f : m_new;
                const float alpha = l_i * __expf(m_i - m_safe);         // l_i e^(m_i - m_new)
                const float beta = __expf(m_tilde[e2] - m_safe);        // e^(m~_ij - m_new)
                const float l_new = alpha + beta * l_tilde[e2];
                const float inv = l_new == 0.f ? 0.f : 1.f / l_new;  // (NaN stays NaN)
                __syncwarp();  // every lane of the quad has read l_i, m_i before lane 0 writes
                if (!valid) continue;
                float* o_row = o_hbm + (long long)row * d + (lane % 4) * 2;
#pragma unroll
                for (int nt = 0; nt < NT_O; ++nt) {
                    if (nt * 8 >= d) break;
                    Float2 o = *reinterpret_cast<Float2*>(o_row + nt * 8);
                    o.x = inv * (alpha * o.x + beta * pv[nt][e2 * 2]);
                    o.y = inv * (alpha * o.y + beta * pv[nt][e2 * 2 + 1]);
                    *reinterpret_cast<Float2*>(o_row + nt * 8) = o;
                }
                if (lane % 4 == 0) {
                    m_hbm[row] = m_new;
                    l_hbm[row] = l_new;
                }
            }
        }
    }
}

// out = O (input dtype, with O's strides, 16-byte aligned rows), L = m + log l (-inf where
// l = 0: the row saw no key). One thread per 8 elements of O; grid (ceil(seqlen_q * d / 8 /
// 128), heads, batch).
template <typename T>
__global__ void __launch_bounds__(128)
fa1_finalize(const FwdParams p) {
    const int head = blockIdx.y, batch = blockIdx.z, nheads = gridDim.y;
    const SeqInfo seq = seq_info(p, batch);
    const int seqlen_q = seq.seqlen_q, d = p.d;
    const int chunks = d / 8;
    const long long idx = (long long)blockIdx.x * 128 + threadIdx.x;
    if (idx >= (long long)seqlen_q * chunks) return;
    const int row = idx / chunks, c = idx % chunks;
    const long long at = seq.row_vector(head, nheads) + row;  // (batch, head, row)
    const float* src = p.o_accum + at * d + c * 8;
    const Float4 lo = *reinterpret_cast<const Float4*>(src);
    const Float4 hi = *reinterpret_cast<const Float4*>(src + 4);
    Chunk16 packed;
    packed.x = T::pack(lo.x, lo.y);
    packed.y = T::pack(lo.z, lo.w);
    packed.z = T::pack(hi.x, hi.y);
    packed.w = T::pack(hi.z, hi.w);
    *reinterpret_cast<Chunk16*>(p.o + seq.q_offset(p.o_stride_b, p.o_stride_s) +
                                row * p.o_stride_s + head * p.o_stride_h + c * 8) = packed;
    if (c == 0) {
        const float l_row = p.l_accum[at];
        // l = 0: the row saw no key; a NaN l (NaN in Q or K) gives L = NaN, not -inf
        p.lse[at] = l_row == 0.f ? CUFLASH_NEG_INF : p.m_accum[at] + logf(l_row);
    }
}

}  // namespace cuflash
