// score.cuh: what happens to a score S_ij = Q_i K_j^T before the softmax.
//
// The kernels hold S unscaled in their accumulators and call the score hook, then the softmax
// exponentiates with exp2(exp2_scale * S - ...). Two hooks:
//   ScoreScale  folds the softmax scale into that exponent (one FMA per element, log2(e)
//               included) and rewrites nothing (REWRITES = false: no kernel calls apply);
//   ScoreHook   FlashAttention-2's softcap and ALiBi, element by element, given the row and key
//               indices: S -> softcap tanh(scale S / softcap) (softcap > 0; the parameters'
//               softcap_in = scale / softcap, softcap_out = softcap / scale, and
//               softcap_log2 = softcap log2 e, with which a kernel that exponentiates the
//               softcap alone takes exp2(softcap_log2 tanh - ...) straight from the tanh:
//               the Hopper backward at d 64), then
//               S -> S - slope |row + seqlen_k - seqlen_q - col| (ALiBi slopes given; ring
//               attention's blocks shift that diagonal: p.alibi_shift). It keeps
//               its result in S's unscaled units (divided by the scale), so that the softmax's
//               exponent and L = m lse_scale + log l stay as they are. (Keeping it in units of
//               softcap / scale instead saves a multiply per element, but the scales then take
//               registers of their own, not the parameters' constant bank: the d 128 forward
//               and four backward tiles spilled.) Both features are
//               runtime parameters of the one hooked kernel (a kernel per combination would
//               double the compiled specialisations again); the plain path keeps ScoreScale.
// The forward kernels take ALiBi in two parts wherever a block lies on one side of its rows'
// diagonal (every block under the causal mask; outside it, at d 64, all but the blocks
// crossing it: split_alibi_both_sides): the element's (one FFMA) and the row's, which the
// softmax adds to its row max and exponent (apply_fragment with row_bias,
// OnlineSoftmax::update with row_bias).
// The backward needs the hook's derivative for dS: apply(s, dist, dfactor) also gives
// dfactor = 1 - tanh^2 with the softcap, 1 without (ALiBi's bias has none): d(hooked)/dS is
// dfactor, and the kernels apply the scale after their matmuls, as without a hook.
// cuflash/reference.py mirrors both (Score).
#pragma once

namespace cuflash {

struct ScoreScale {
    static constexpr bool REWRITES = false;  // S is left as it is
    float exp2_scale;  // the softmax's exponent: exp(scale * S) = exp2(exp2_scale * S)
    float lse_scale;   // L_i = m_i * lse_scale + log(l_i), m_i the row max of the hooked S

    template <class Params>
    __device__ __forceinline__ explicit ScoreScale(const Params& p)
        : exp2_scale(p.scale_log2), lse_scale(p.softmax_scale) {}
    // (the hooked kernels' constructor, for kernels written for either hook)
    template <class Params>
    __device__ __forceinline__ ScoreScale(const Params& p, int /*batch*/, int /*head*/)
        : ScoreScale(p) {}

    // Whether apply_fragment leaves a part of S per row in row_bias (ScoreHook's): never.
    template <int HD, class MaskT>
    __host__ __device__ static constexpr bool has_row_bias() {
        return false;
    }
    template <bool SHIFTED, class Params>
    __device__ __forceinline__ float diagonal(const Params&, int, int, int, int) const {
        return 0.f;
    }
    template <class Params>
    __device__ __forceinline__ float apply(const Params&, float s, float) const { return s; }
    template <class Params>
    __device__ __forceinline__ float apply(const Params&, float s, float,
                                           float& dfactor) const {
        dfactor = 1.f;
        return s;
    }
};

// Whether a kernel's ALiBi distances take the parameters' alibi_shift (ScoreHook::diagonal):
// dense batches under the local masks, which the host sends every shifted block as
// (_api._window), so that the plain and causal kernels stay as they were.
template <class SeqT, class MaskT>
__host__ __device__ constexpr bool shifted_diagonal() {
    return !SeqT::PACKED && MaskT::LOCAL;
}

// Whether a forward or decode tile of head-dim bucket HD splits ALiBi on both sides of the
// diagonal (ScoreHook::apply_fragment) outside the causal mask: at d 64, where the
// softmax's work per element weighs most against the matmuls (session 19, non-causal ALiBi:
// the Hopper forward 1-3% less time, the portable one 4-6%). At d 128 the portable forward
// measured 1-3% slower, and the Hopper tiles of d 128 (128 x 176) and d 256 spilled; d 32
// was not measured.
template <int HD>
__host__ __device__ constexpr bool split_alibi_both_sides() {
    return HD == 64;
}

// tanh on the special-function unit (sm_75+): relative error about 2^-11, below the rounding
// of a 16-bit P.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The hook keeps one register of its own (this (batch, head)'s ALiBi slope); the softcap's
// factors and the lengths are read from the parameters where it is applied (a hook holding
// them pushed the register-tight backward tiles into spills).
struct ScoreHook {
    static constexpr bool REWRITES = true;
    float exp2_scale, lse_scale;  // as ScoreScale's
    float slope;                  // this (batch, head)'s ALiBi slope, over the scale (0: none)

    template <class Params>
    __device__ __forceinline__ ScoreHook(const Params& p, int batch, int head)
        : exp2_scale(p.scale_log2), lse_scale(p.softmax_scale),
          slope(p.alibi_slopes ? p.alibi_slopes[batch * p.alibi_stride_b + head] /
                                     p.softmax_scale
                               : 0.f) {}

    // The signed distance of key col from query row's diagonal, row + seqlen_k - seqlen_q -
    // col, as a float. Kernels take it once per row and block at their lane's first column and
    // subtract each element's column offset (a compile-time constant), so that the hook's
    // per-element work stays on the FP32 pipe: an int-to-float conversion per element runs on
    // the quarter-rate unit the exponentials need (exact while |distance| < 2^24 keys).
    // (seqlen_q, seqlen_k: the batch entry's, seqinfo.cuh.) SHIFTED: plus the parameters'
    // alibi_shift, where ring attention's blocks move the diagonal (their queries and keys sit
    // elsewhere in the sequence; 0 otherwise), added as a float: exact below 2^24 keys, an add
    // with a constant operand. Kernels pass SHIFTED for dense batches under the local masks
    // only: the host sends every shifted block as one (_api._window). Elsewhere the distance
    // stays the integer sum that the mask's own diagonal shares: with the add, the
    // register-tight d 256 causal backward tiles spilled, and the d 128 Hopper forward with
    // the softcap ran 4% slower (PERFORMANCE.md).
    template <bool SHIFTED, class Params>
    __device__ __forceinline__ float diagonal(const Params& p, int row, int col, int seqlen_q,
                                              int seqlen_k) const {
        const float d = static_cast<float>(row + seqlen_k - seqlen_q - col);
        return SHIFTED ? d + p.alibi_shift : d;
    }
    // The two formulas, each in one place (S and the result in S's units):
    //   softcap: tanh(scale S / softcap) (cap_in = p.softcap_in = scale / softcap), which the
    //            caller multiplies by softcap / scale (p.softcap_out)
    __device__ static __forceinline__ float softcap_tanh(float s, float cap_in) {
        return tanh_approx(s * cap_in);
    }
    //   the softcap's step of an element pass that needs its derivative too (the backward):
    //            t = tanh(scale S / softcap), dfactor = 1 - t^2, and the hooked score in S's
    //            units (softcap_out t), or t itself where FOLDED: the caller takes the
    //            exponent as exp2(softcap_log2 t - ...), the factors folded (the softcap alone)
    template <bool FOLDED, class Params>
    __device__ static __forceinline__ float softcap(const Params& p, float s, float& dfactor) {
        const float t = softcap_tanh(s, p.softcap_in);
        const float hooked = FOLDED ? t : p.softcap_out * t;
        dfactor = 1.f - t * t;
        return hooked;
    }
    //   ALiBi:   S - slope |i + seqlen_k - seqlen_q - j|, given that distance
    __device__ __forceinline__ float alibi(float s, float dist) const {
        return fmaf(-slope, fabsf(dist), s);
    }

    // The hooked score of S at diagonal distance `dist`, in S's units, and its derivative with
    // respect to S (dfactor: 1 - tanh^2 with the softcap, else 1).
    template <class Params>
    __device__ __forceinline__ float apply(const Params& p, float s, float dist,
                                           float& dfactor) const {
        dfactor = 1.f;
        if (p.softcap_in != 0.f)  // (uniform: every lane of the kernel takes the same way)
            s = softcap<false>(p, s, dfactor);
        return alibi(s, dist);  // (a slope of 0: S itself)
    }
    template <class Params>
    __device__ __forceinline__ float apply(const Params& p, float s, float dist) const {
        float unused;
        return apply(p, s, dist, unused);
    }

    // The forward's hook over a fragment of S: NT n8 tiles of the mma accumulator layout
    // (element e of tile nt at row e / 2, column 8 nt + e % 2 of the lane's), dist[e / 2] the
    // diagonal distance at the lane's first column. Whether the softcap is on is tested once,
    // not per element, so that each variant's loop is one straight run the scheduler
    // interleaves (a test per element measured the forward 1.4-1.9x the plain kernel's time).
    template <class Params, int NT>
    __device__ __forceinline__ void apply_fragment(const Params& p, float (&s)[NT][4],
                                                   const float (&dist)[2]) const {
        if (p.softcap_in != 0.f)  // (ALiBi's term in both: a slope of 0 adds nothing)
            fragment<true>(p, s, dist);
        else
            fragment<false>(p, s, dist);
    }

    // The same with ALiBi's term split into a part of the element and a part of the row
    // wherever this warp's block lies on one side of each row's diagonal. Left of it (every
    // distance >= 0: always under the mask's LEFT_OF_DIAGONAL, the causal mask, where hidden
    // keys are masked to -inf after the hook), the term at the lane's column c of the block is
    //     -slope |dist - c| = slope c - slope dist,
    // right of it (every distance <= 0) -slope c + slope dist: S gets sign slope c (one FFMA
    // with an immediate per element, where the full term takes an FADD and an FFMA) and
    // row_bias[e2] = -sign slope dist[e2] comes back for the softmax, which adds it to this
    // lane's row max and to its exponent's offset (OnlineSoftmax::update<true>): m_i, P~ and
    // L_i are those of the full term. Without a causal mask the side is a warp vote on the
    // lanes' distances (uniform, so that each variant stays one straight run): only the blocks
    // that cross the diagonal, about one per row in n / B_c, take the full term, with
    // row_bias = 0. Outside the causal mask the split is taken only where
    // split_alibi_both_sides<HD>() (else the full term, row_bias = 0): the kernels call
    // OnlineSoftmax::update<has_row_bias<HD, MaskT>()>, true where either split may happen.
    template <int HD, class MaskT>
    __host__ __device__ static constexpr bool has_row_bias() {
        return MaskT::LEFT_OF_DIAGONAL || split_alibi_both_sides<HD>();
    }
    template <int HD, class MaskT, class Params, int NT>
    __device__ __forceinline__ void apply_fragment(const Params& p, float (&s)[NT][4],
                                                   const float (&dist)[2],
                                                   float (&row_bias)[2]) const {
        float side = 1.f;  // +1: left of the diagonal, -1: right of it
        if constexpr (!MaskT::LEFT_OF_DIAGONAL) {
            bool left = false, right = false;
            if constexpr (split_alibi_both_sides<HD>()) {
                constexpr float LAST_C = (NT - 1) * 8 + 1;  // the lane's last column offset
                left = __all_sync(0xffffffffu, fminf(dist[0], dist[1]) >= LAST_C);
                right = __all_sync(0xffffffffu, fmaxf(dist[0], dist[1]) <= 0.f);
            }
            if (!left && !right) {
                row_bias[0] = row_bias[1] = 0.f;
                apply_fragment(p, s, dist);
                return;
            }
            side = left ? 1.f : -1.f;
        }
        const float signed_slope = side * slope;
        row_bias[0] = -signed_slope * dist[0];
        row_bias[1] = -signed_slope * dist[1];
        if (p.softcap_in != 0.f)
            fragment<true, true>(p, s, dist, signed_slope);
        else
            fragment<false, true>(p, s, dist, signed_slope);
    }

  private:
    // (SPLIT: the element's part of the split term, signed_slope c; else the full term)
    template <bool SOFTCAP, bool SPLIT = false, class Params, int NT>
    __device__ __forceinline__ void fragment(const Params& p, float (&s)[NT][4],
                                             const float (&dist)[2],
                                             float signed_slope = 0.f) const {
        const float cap_in = p.softcap_in, cap_out = p.softcap_out;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float x = SOFTCAP ? cap_out * softcap_tanh(s[nt][e], cap_in) : s[nt][e];
                const float c = static_cast<float>(nt * 8 + e % 2);  // (a compile-time constant)
                s[nt][e] = SPLIT ? fmaf(signed_slope, c, x) : alibi(x, dist[e / 2] - c);
            }
    }
};

}  // namespace cuflash
