// score.cuh: what happens to a score S_ij = Q_i K_j^T before the softmax.
//
// The kernels hold S unscaled in their accumulators and call the score hook, then the softmax
// exponentiates with exp2(exp2_scale * S - ...). The hook of today, ScoreScale, folds the
// softmax scale into that exponent (one FMA per element, log2(e) included) and rewrites nothing.
// Softcap (S -> cap * tanh(scale S / cap)) and ALiBi (S -> S - slope |i + seqlen_k - seqlen_q -
// j|) are hooks that rewrite S element by element, given the row and key indices, and say what
// the softmax then multiplies by; the kernels already pass every element through `apply` when
// a hook's REWRITES is true, and the backward will need the hook's derivative (dS).
#pragma once

namespace cuflash {

struct ScoreScale {
    static constexpr bool REWRITES = false;  // S is left as it is
    float exp2_scale;  // the softmax's exponent: exp(scale * S) = exp2(exp2_scale * S)
    float lse_scale;   // L_i = m_i * lse_scale + log(l_i), m_i the row max of the hooked S

    template <class Params>
    __device__ __forceinline__ explicit ScoreScale(const Params& p)
        : exp2_scale(p.scale_log2), lse_scale(p.softmax_scale) {}

    __device__ __forceinline__ float apply(float s, int /*row*/, int /*col*/) const { return s; }
};

}  // namespace cuflash
