// softmax.cuh: the online softmax of the FA2 forward, over an mma accumulator fragment.
//
// For each column block j, with S_ij in the accumulators of one warp (MT m16 tiles of rows, NT
// n8 tiles of keys; lane holds rows lane / 4 and lane / 4 + 8 of each m16 tile, columns
// 2 (lane % 4) and + 1 of each n8 tile, so a row lives in one quad of lanes):
//     m_new  = max(m_i, rowmax(S_ij))
//     P~_ij  = exp(scale (S_ij - m_new))                  (in place of S_ij)
//     l_i    = e^(scale (m_i - m_new)) l_i + rowsum(P~_ij)
//     O~_i   = diag(e^(scale (m_i - m_new))) O~_i
//     m_i    = m_new
// and at the end  O_i = diag(l_i)^-1 O~_i,  L_i = scale m_i + log(l_i).
// m_i is kept in S's units; `scale` comes from the score hook (score.cuh). A row that has seen
// no key keeps m_i = -inf and l_i = 0, and ends with O_i = 0 and L_i = -inf; a NaN in S
// (NaN in Q or K) makes l_i NaN, and O_i and L_i stay NaN.
// The wgmma accumulator of the Hopper forward has the same row-per-quad layout, so this code
// serves it where N is a multiple of 8.
//
// Variants (register pressure, ForwardTile::LEAN):
//   LEAN = false: each lane keeps partial row sums l[mt][e2] of its own columns, reduced over
//                 the quad at the end;
//   LEAN = true:  the row sums of each step are reduced over the quad at once, and lane t of a
//                 quad keeps l_i of row (mt, e2) = (t / 2, t % 2) alone, one register;
//   LAZY = true:  m_i moves only when rowmax(S_ij) passes it by more than 2^RESCALE_LOG2 in
//                 P~, so most steps skip the rescaling of O~_i (O_i and L_i are the same for
//                 any m_i that O~_i and l_i share; P~ stays <= 2^RESCALE_LOG2).
//   POLY_EVERY = N > 0: the exponentials of every N-th n8 tile of keys on the FMA pipe
//                 (exp2_poly, common.cuh) instead of the MUFU unit, which the rest keep.
#pragma once

#include "common.cuh"

namespace cuflash {

template <int MT, int NT_S, int NT_O, bool LEAN, bool LAZY, int RESCALE_LOG2 = 8,
          int POLY_EVERY = 0>
struct OnlineSoftmax {
    float m[MT][2];  // m_i, running row max of S (hooked, unscaled)
    float l[MT][2];  // l_i, this lane's part of the row sum (LEAN = false)
    float l_own;     // LEAN: l_i of row (mt, e2) = ((lane & 3) / 2, (lane & 3) % 2)

    __device__ __forceinline__ OnlineSoftmax() : l_own(0.f) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            m[mt][0] = m[mt][1] = CUFLASH_NEG_INF;
            l[mt][0] = l[mt][1] = 0.f;
        }
    }

    // S_ij -> P~_ij in s; l_i, m_i and O~_i updated (see the header). exp2_scale: the score
    // hook's exponent scale.
    // ROW_BIAS: this lane's elements of row (mt, e2) are S_ij less row_bias[mt][e2] (the score
    // hook's row part, score.cuh): the row max takes it back per lane, before the quad's
    // reduction, and so does the exponent's offset, so m_i, P~ and L_i are those of S_ij.
    // Without: row_bias is not read.
    template <bool ROW_BIAS>
    __device__ __forceinline__ void update(float (&s)[MT][NT_S][4], float (&o)[MT][NT_O][4],
                                           float exp2_scale, int lane,
                                           const float (&row_bias)[MT][2]) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                // m_new = max(m_i, rowmax(S_ij)) over the row's quad
                float m_new = m[mt][e2];
                if constexpr (ROW_BIAS) {  // (-inf + the bias stays -inf)
                    float mine = CUFLASH_NEG_INF;
#pragma unroll
                    for (int nt = 0; nt < NT_S; ++nt)
                        mine = fmaxf(mine, fmaxf(s[mt][nt][e2 * 2], s[mt][nt][e2 * 2 + 1]));
                    m_new = fmaxf(m_new, mine + row_bias[mt][e2]);
                } else {
#pragma unroll
                    for (int nt = 0; nt < NT_S; ++nt)
                        m_new = fmaxf(m_new, fmaxf(s[mt][nt][e2 * 2], s[mt][nt][e2 * 2 + 1]));
                }
                m_new = quad_max(m_new);
                bool grow = true;
                if (LAZY) {
                    grow = m_new * exp2_scale > m[mt][e2] * exp2_scale + RESCALE_LOG2;
                    if (!grow) m_new = m[mt][e2];  // alpha = 1 below
                }
                // A row with nothing visible yet keeps m = -inf; use 0 so that -inf - -inf
                // never makes a NaN (its P~ is exp(-inf) = 0 either way).
                const float m_scaled = m_new == CUFLASH_NEG_INF ? 0.f : m_new * exp2_scale;
                const float alpha = exp2_approx(m[mt][e2] * exp2_scale - m_scaled);
                m[mt][e2] = m_new;
                if (!LEAN) l[mt][e2] *= alpha;
                float rowsum = 0.f;  // (LEAN) this lane's part of rowsum(P~_ij)
                // O~_i *= alpha (a warp-uniform branch: skipped when no row of the warp moved
                // its m_i)
                if (!LAZY || __any_sync(0xffffffffu, grow))
#pragma unroll
                for (int nt = 0; nt < NT_O; ++nt) {
                    o[mt][nt][e2 * 2] *= alpha;
                    o[mt][nt][e2 * 2 + 1] *= alpha;
                }
                // P~_ij = exp2(exp2_scale S_ij - m_scaled); l_i += rowsum(P~_ij)
                const float offset =
                    ROW_BIAS ? fmaf(row_bias[mt][e2], exp2_scale, -m_scaled) : -m_scaled;
#pragma unroll
                for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
                    for (int e1 = 0; e1 < 2; ++e1) {
                        float& x = s[mt][nt][e2 * 2 + e1];
                        const float arg = fmaf(x, exp2_scale, offset);
                        x = POLY_EVERY > 0 && nt % POLY_EVERY == POLY_EVERY - 1
                                ? exp2_poly(arg)
                                : exp2_approx(arg);
                        if (!LEAN)
                            l[mt][e2] += x;
                        else
                            rowsum += x;
                    }
                if (LEAN) {  // (lane & 3, not lane % 4: with that ptxas spilled 96 bytes)
                    const float sum = quad_sum(rowsum);  // rowsum(P~_ij), in every lane
                    if ((lane & 3) == mt * 2 + e2) l_own = fmaf(l_own, alpha, sum);
                }
            }
    }

    // l_i of row (mt, e2), the same in every lane of its quad.
    __device__ __forceinline__ float row_sum(int mt, int e2, int lane) const {
        return !LEAN ? quad_sum(l[mt][e2])
                     : __shfl_sync(0xffffffffu, l_own, (lane & ~3) | (mt * 2 + e2));
    }

    // O_i = diag(l_i)^-1 O~_i for row (mt, e2), given its l_i (l_i = 0: the row saw no key,
    // O_i = 0; a NaN l_i stays NaN). APPROX: 1 / l_i from the special-function unit (2 ulp:
    // l_i is at most the keys times 2^RESCALE_LOG2, far below __fdividef's limit of 2^126, and
    // O_i is rounded to 16 bits after) instead of the IEEE division, whose slow-path call sat
    // on the epilogue's path. The Hopper forward's two-consumer tiles take it (session 27: with
    // it ptxas scheduled the three-consumer tiles' main loop differently, 2% slower at d 64).
    template <bool APPROX = false>
    __device__ __forceinline__ void normalise(float (&o)[MT][NT_O][4], int mt, int e2,
                                              float l_row) const {
        const float inv_l = l_row == 0.f ? 0.f : APPROX ? __fdividef(1.f, l_row) : 1.f / l_row;
#pragma unroll
        for (int nt = 0; nt < NT_O; ++nt) {
            o[mt][nt][e2 * 2] *= inv_l;
            o[mt][nt][e2 * 2 + 1] *= inv_l;
        }
    }

    // L_i = lse_scale m_i + log(l_i) of row (mt, e2) (-inf where it saw no key).
    __device__ __forceinline__ float lse(int mt, int e2, float l_row, float lse_scale) const {
        // (log(l_i) by __logf, lg2.approx: an absolute error of about 2^-21, which the
        // backward's exp(S - L_i) turns into a relative error of P far below its 16-bit
        // rounding; logf's ~15 FMA-pipe instructions were on the epilogue's path)
        return l_row == 0.f ? CUFLASH_NEG_INF : m[mt][e2] * lse_scale + __logf(l_row);
    }
};

}  // namespace cuflash
