// fa2_backward.cu: FlashAttention-2 backward (recompute), on tensor cores (mma.sync m16n8k16,
// fp32 accumulate), sm_80 and newer. Three kernels, launched in this order:
//
//   fa2_backward_preprocess   D = rowsum(dO ∘ O)                       (float32, per query row)
//   fa2_backward              dK, dV per column block; dQ accumulated in float32
//   fa2_backward_dq           dQ = softmax_scale * sum(dQ_accum), cast to the input dtype
//
// Algorithm (the seed document, section 2.4.1.2; names as there): one thread block per
// (column block j of K/V, head, batch). K_j and V_j stay in shared memory and dK_j, dV_j in
// registers, while the block walks the row blocks i of Q that see column block j:
//       S_ij  = Q_i K_j^T                         recomputed, never stored in HBM
//       P_ij  = exp(scale * S_ij - L_i)           from the forward's log-sum-exp L
//       dV_j += P_ij^T dO_i
//       dP_ij = dO_i V_j^T
//       dS_ij = P_ij ∘ (dP_ij - D_i)
//       dK_j += dS_ij^T Q_i                       (times scale at the end)
//       dQ_i += dS_ij K_j                         (float32 atomics into dQ_accum; times scale in
//                                                  fa2_backward_dq)
// Causal: row blocks entirely above the diagonal of column block j are never visited, and the
// mask is applied only on blocks that cross it (block_range.cuh).
//
// Work split: B_r = B_c = 64. Every matrix product splits its M rows over 4 warps (16 rows
// each) and its N columns over NWARPS / 4 warps. S and dP are computed by the warp that owns
// the (query rows, keys) tile; P and dS go through shared memory so that the dV, dK and dQ
// products can read them transposed (ldmatrix .trans) with their own warp split.
//
// Deterministic mode (`deterministic` = 1): gridDim.x is a fixed number of splits; thread block
// x handles column blocks x, x + gridDim.x, ... and owns slice x of dQ_accum. Each element of a
// slice is then updated by one thread only, in program order, so the sums come out the same on
// every run; fa2_backward_dq adds the slices in a fixed order. Otherwise gridDim.x = T_c and all
// blocks add into slice 0, in whatever order the atomics land.
//
// Variants: T (fp16 | bf16), HD (head-dim bucket), NWARPS (4, or 8 for HD % 64 == 0),
// QSTAGES (1 or 2 shared-memory buffers for Q_i, dO_i, L_i, D_i), CAUSAL.
#include "common.cuh"
#include "block_range.cuh"

namespace cuflash {

// ---------------------------------------------------------------------------------------------
// D = rowsum(dO ∘ O)
// ---------------------------------------------------------------------------------------------
// G lanes (a power of two >= d / 8) share one query row, each taking 8 elements; grid
// (ceil(seqlen_q / (128 / G)), heads, batch). Dsum is (batch, heads, seqlen_q), contiguous.
template <typename T>
__global__ void __launch_bounds__(128)
fa2_backward_preprocess(const elem_t* __restrict__ O, const elem_t* __restrict__ dO,
                        float* __restrict__ Dsum, int seqlen_q, int d, int G,
                        long long o_stride_b, long long o_stride_s, long long o_stride_h,
                        long long do_stride_b, long long do_stride_s, long long do_stride_h) {
    const int head = blockIdx.y, batch = blockIdx.z, nheads = gridDim.y;
    const int row = blockIdx.x * (128 / G) + threadIdx.x / G, c = threadIdx.x % G;
    float acc = 0.f;
    if (row < seqlen_q && c < d / 8) {
        const Chunk16 o = *reinterpret_cast<const Chunk16*>(
            O + batch * o_stride_b + row * o_stride_s + head * o_stride_h + c * 8);
        const Chunk16 g = *reinterpret_cast<const Chunk16*>(
            dO + batch * do_stride_b + row * do_stride_s + head * do_stride_h + c * 8);
        const elem_t* oe = reinterpret_cast<const elem_t*>(&o);
        const elem_t* ge = reinterpret_cast<const elem_t*>(&g);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(T::to_float(oe[e]), T::to_float(ge[e]), acc);
    }
    for (int offset = G / 2; offset > 0; offset /= 2) acc += shfl_xor(acc, offset);
    if (c == 0 && row < seqlen_q) Dsum[((long long)batch * nheads + head) * seqlen_q + row] = acc;
}

// ---------------------------------------------------------------------------------------------
// Tile shape
// ---------------------------------------------------------------------------------------------
template <int HD_, int NWARPS_, int QSTAGES_>
struct BackwardTile {
    static constexpr int HD = HD_, NWARPS = NWARPS_, QSTAGES = QSTAGES_;
    static constexpr int B_r = 64, B_c = 64;
    static constexpr int NTHREADS = NWARPS * 32;
    static constexpr int WN = NWARPS / 4;         // warps along N of every product
    static constexpr int NS = B_c / WN / 8;       // n8 tiles per warp of S, dP (keys)
    static constexpr int NH = HD / WN / 8;        // n8 tiles per warp of dK, dV, dQ (head dim)
    static constexpr int DQ_PASS = NH % 8 == 0 && NH < 16 ? 8 : NH % 4 == 0 ? 4 : 2;  // per pass
    // Shared memory, in bytes.
    static constexpr int TILE_KV = B_c * HD * 2;  // K_j, V_j
    static constexpr int TILE_Q = B_r * HD * 2;   // Q_i, dO_i (QSTAGES copies each)
    static constexpr int TILE_P = B_r * B_c * 2;  // P_ij, dS_ij
    static constexpr int VEC = B_r * 4;           // L_i, D_i (QSTAGES copies each)
    static constexpr int SMEM_BYTES = 2 * TILE_KV + QSTAGES * (2 * TILE_Q + 2 * VEC) + 2 * TILE_P;

    static_assert(HD % 32 == 0 && HD <= 256, "head-dim bucket must be a multiple of 32, <= 256");
    static_assert(NWARPS == 4 || ((NWARPS == 8 || NWARPS == 16) && HD % 64 == 0),
                  "8 or 16 warps split the head dim into parts of whole 8-chunk groups");
    static_assert(QSTAGES == 1 || QSTAGES == 2, "1 or 2 buffers for the row block");
};

// ---------------------------------------------------------------------------------------------
// The main backward kernel
// ---------------------------------------------------------------------------------------------
// Q, dO: (batch, seqlen_q, heads, d); K, V: (batch, seqlen_k, heads_k, d), any strides with a
// contiguous last dim; query head h reads kv head h / group. L, Dsum: (batch, heads, seqlen_q)
// float32. dQ_accum: (splits, batch, heads, seqlen_q, d) float32, zeroed. dK, dV: when
// `expanded` is 0, the input dtype with kv heads (group == 1); when 1, float32 with one slice
// per query head (batch, seqlen_k, heads, d), summed over each group afterwards.
template <typename T, int HD, int NWARPS, int QSTAGES, bool CAUSAL>
__global__ void __launch_bounds__(NWARPS * 32, 1)
fa2_backward(const elem_t* __restrict__ Q, const elem_t* __restrict__ K,
             const elem_t* __restrict__ V, const elem_t* __restrict__ dO,
             const float* __restrict__ L, const float* __restrict__ Dsum,
             float* __restrict__ dQ_accum, void* __restrict__ dK, void* __restrict__ dV,
             int deterministic, int expanded, int seqlen_q, int seqlen_k, int d, int group,
             long long q_stride_b, long long q_stride_s, long long q_stride_h,
             long long k_stride_b, long long k_stride_s, long long k_stride_h,
             long long v_stride_b, long long v_stride_s, long long v_stride_h,
             long long do_stride_b, long long do_stride_s, long long do_stride_h,
             long long dk_stride_b, long long dk_stride_s, long long dk_stride_h,
             float softmax_scale, float scale_log2) {
    using Tile = BackwardTile<HD, NWARPS, QSTAGES>;
    constexpr int B_r = Tile::B_r, B_c = Tile::B_c, NTHREADS = Tile::NTHREADS;
    constexpr int NS = Tile::NS, NH = Tile::NH;
    constexpr float LOG2E = 1.4426950408889634f;

    // ---- shared memory: one buffer carved into named tiles --------------------------------
    extern __shared__ __attribute__((aligned(128))) unsigned char smem[];
    elem_t* sK = reinterpret_cast<elem_t*>(smem);                     // (B_c, HD)  K_j
    elem_t* sV = sK + B_c * HD;                                       // (B_c, HD)  V_j
    elem_t* sQ = sV + B_c * HD;                                       // QSTAGES x (B_r, HD) Q_i
    elem_t* sdO = sQ + QSTAGES * B_r * HD;                            // QSTAGES x (B_r, HD) dO_i
    elem_t* sP = sdO + QSTAGES * B_r * HD;                            // (B_r, B_c) P_ij
    elem_t* sdS = sP + B_r * B_c;                                     // (B_r, B_c) dS_ij
    float* sL = reinterpret_cast<float*>(sdS + B_r * B_c);            // QSTAGES x (B_r) L_i
    float* sD = sL + QSTAGES * B_r;                                   // QSTAGES x (B_r) D_i

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp % 4, wn = warp / 4;  // this warp's 16-row group and N part
    const int head = blockIdx.y, batch = blockIdx.z, nheads = gridDim.y, nbatch = gridDim.z;
    const int head_k = head / group;
    const int chunks = d / 8;
    const int T_c = (seqlen_k + B_c - 1) / B_c;

    const elem_t* q = Q + batch * q_stride_b + head * q_stride_h;
    const elem_t* k = K + batch * k_stride_b + head_k * k_stride_h;
    const elem_t* v = V + batch * v_stride_b + head_k * v_stride_h;
    const elem_t* dout = dO + batch * do_stride_b + head * do_stride_h;
    const long long bh = (long long)batch * nheads + head;
    const float* lse = L + bh * seqlen_q;
    const float* dsum = Dsum + bh * seqlen_q;
    float* dq_acc = dQ_accum +
        ((deterministic ? (long long)blockIdx.x * nbatch * nheads : 0) + bh) * seqlen_q * d;

    // ldmatrix addressing (common.cuh: lane patterns and SwizzledReader). Five readers serve
    // the ten operands: tiles read the same way differ only by a compile-time byte offset.
    const unsigned sbase = smem_u32(smem);
    constexpr unsigned OFF_K = 0, OFF_V = Tile::TILE_KV, OFF_Q = 2 * Tile::TILE_KV;
    constexpr unsigned OFF_DO = OFF_Q + QSTAGES * Tile::TILE_Q;
    constexpr unsigned OFF_P = OFF_DO + QSTAGES * Tile::TILE_Q, OFF_DS = OFF_P + Tile::TILE_P;
    const int rf_row = lane_row_rows_first(lane), rf_chunk = lane_chunk_rows_first(lane);
    const int cf_row = lane_row_chunks_first(lane), cf_chunk = lane_chunk_chunks_first(lane);
    // A of Q_i K_j^T and dO_i V_j^T: this warp's 16 query rows of Q_i / dO_i
    const SwizzledReader<HD> rd_rows(sbase + wm * 16 * HD * 2, rf_row, rf_chunk);
    // B of Q_i K_j^T and dO_i V_j^T: the keys of part wn of K_j / V_j
    const SwizzledReader<HD> rd_keys(sbase + wn * (B_c / Tile::WN) * HD * 2, cf_row, cf_chunk);
    // B (.trans) of P^T dO_i, dS^T Q_i and dS K_j: head-dim part wn of dO_i / Q_i / K_j
    const SwizzledReader<HD> rd_hpart(sbase, rf_row, rf_chunk, wn * HD / Tile::WN / 8);
    // A (.trans) of P^T dO_i and dS^T Q_i: keys 16 wm.. are chunks 2 wm.. of P / dS
    const SwizzledReader<B_c> rd_ptrans(sbase, cf_row, cf_chunk, 2 * wm);
    // A of dS K_j: this warp's 16 query rows of dS
    const SwizzledReader<B_c> rd_ds(sbase + wm * 16 * B_c * 2, rf_row, rf_chunk);

    // Q_i, dO_i, L_i, D_i: HBM -> shared buffer `buf` (cp.async; caller commits).
    auto load_row_block = [&](int i, int buf) {
        const int row0 = i * B_r;
        load_tile_async<B_r, HD, NTHREADS>(sQ + buf * B_r * HD, q + row0 * q_stride_s,
                                           q_stride_s, seqlen_q - row0, chunks, tid);
        load_tile_async<B_r, HD, NTHREADS>(sdO + buf * B_r * HD, dout + row0 * do_stride_s,
                                           do_stride_s, seqlen_q - row0, chunks, tid);
        if (tid < B_r) {
            const bool valid = row0 + tid < seqlen_q;
            cp_async_4(smem_u32(sL + buf * B_r + tid), lse + (valid ? row0 + tid : 0), valid);
            cp_async_4(smem_u32(sD + buf * B_r + tid), dsum + (valid ? row0 + tid : 0), valid);
        }
    };

    for (int j = blockIdx.x; j < T_c; j += gridDim.x) {
        const int col0 = j * B_c;  // first key of K_j
        const RowBlocks rb = row_blocks<B_r, B_c, CAUSAL>(j, seqlen_q, seqlen_k);

        float dk[NH][4], dv[NH][4];  // dK_j, dV_j: keys 16 wm.., head-dim part wn
#pragma unroll
        for (int nt = 0; nt < NH; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.f;

        __syncthreads();  // the previous column block is done with every buffer
        if (rb.begin < rb.end) {
            // K_j, V_j and the first row block in one cp.async group.
            load_tile_async<B_c, HD, NTHREADS>(sK, k + col0 * k_stride_s, k_stride_s,
                                               seqlen_k - col0, chunks, tid);
            load_tile_async<B_c, HD, NTHREADS>(sV, v + col0 * v_stride_s, v_stride_s,
                                               seqlen_k - col0, chunks, tid);
            load_row_block(rb.begin, 0);
            cp_async_commit();
        }

        // ---- the FA2 backward inner loop: one step per row block i ------------------------
        auto step = [&](int i, int buf, auto masked) {
            constexpr bool MASK = decltype(masked)::value;
            const int row0 = i * B_r;
            const unsigned qoff = buf * B_r * HD * 2;  // byte offset of buffer `buf`

            // S_ij = Q_i K_j^T and dP_ij = dO_i V_j^T: (16 rows x B_c / WN keys) per warp.
            float s[NS][4], dp[NS][4];
#pragma unroll
            for (int nt = 0; nt < NS; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk) {
                unsigned aq[4], ado[4];
                ldmatrix_x4(aq, rd_rows.at(0, 2 * kk) + OFF_Q + qoff);
                ldmatrix_x4(ado, rd_rows.at(0, 2 * kk) + OFF_DO + qoff);
#pragma unroll
                for (int nt2 = 0; nt2 < NS / 2; ++nt2) {
                    unsigned bk[4], bv[4];
                    ldmatrix_x4(bk, rd_keys.at(nt2 * 16, 2 * kk) + OFF_K);
                    T::mma(s[2 * nt2], aq, bk[0], bk[1]);
                    T::mma(s[2 * nt2 + 1], aq, bk[2], bk[3]);
                    ldmatrix_x4(bv, rd_keys.at(nt2 * 16, 2 * kk) + OFF_V);
                    T::mma(dp[2 * nt2], ado, bv[0], bv[1]);
                    T::mma(dp[2 * nt2 + 1], ado, bv[2], bv[3]);
                }
            }

            // P_ij = exp(scale S_ij - L_i) (0 where masked), dS_ij = P_ij ∘ (dP_ij - D_i);
            // both stored to shared memory (input dtype) as [query row][key].
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                const int r = wm * 16 + lane / 4 + e2 * 8;  // row within the block
                const float l2 = sL[buf * B_r + r] * LOG2E;
                const float D_r = sD[buf * B_r + r];
                // visible keys of row r within this warp's slice, relative to its first column
                const int limit = visible_limit<CAUSAL>(row0 + r, seqlen_q, seqlen_k) - col0 -
                                  wn * (B_c / Tile::WN) - (lane % 4) * 2;
#pragma unroll
                for (int nt = 0; nt < NS; ++nt) {
                    float p[2], ds[2];
#pragma unroll
                    for (int e1 = 0; e1 < 2; ++e1) {
                        p[e1] = exp2_approx(fmaf(s[nt][e2 * 2 + e1], scale_log2, -l2));
                        if (MASK && nt * 8 + e1 > limit) p[e1] = 0.f;
                        ds[e1] = p[e1] * (dp[nt][e2 * 2 + e1] - D_r);
                    }
                    const int chunk = wn * (B_c / Tile::WN) / 8 + nt;
                    const int off = tile_offset<B_c>(r, chunk) + (lane % 4) * 2;
                    *reinterpret_cast<unsigned*>(sP + off) = T::pack(p[0], p[1]);
                    *reinterpret_cast<unsigned*>(sdS + off) = T::pack(ds[0], ds[1]);
                }
            }
            __syncthreads();  // P_ij and dS_ij are complete

            // dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i: (16 keys x HD / WN) per warp,
            // k = the B_r query rows.
#pragma unroll
            for (int kk = 0; kk < B_r / 16; ++kk) {
                unsigned ap[4], ads[4];
                ldmatrix_x4_trans(ap, rd_ptrans.at(kk * 16, 0) + OFF_P);
                ldmatrix_x4_trans(ads, rd_ptrans.at(kk * 16, 0) + OFF_DS);
#pragma unroll
                for (int nd2 = 0; nd2 < NH / 2; ++nd2) {
                    unsigned bo[4], bq[4];
                    ldmatrix_x4_trans(bo, rd_hpart.at(kk * 16, nd2 * 2) + OFF_DO + qoff);
                    T::mma(dv[2 * nd2], ap, bo[0], bo[1]);
                    T::mma(dv[2 * nd2 + 1], ap, bo[2], bo[3]);
                    ldmatrix_x4_trans(bq, rd_hpart.at(kk * 16, nd2 * 2) + OFF_Q + qoff);
                    T::mma(dk[2 * nd2], ads, bq[0], bq[1]);
                    T::mma(dk[2 * nd2 + 1], ads, bq[2], bq[3]);
                }
            }

            // dQ_i += dS_ij K_j: (16 query rows x HD / WN) per warp, k = the B_c keys, in
            // passes of DQ_PASS n8 tiles so that few registers are live next to dK_j and dV_j.
            const int row = row0 + wm * 16 + lane / 4;
            float* dst0 = dq_acc + wn * (HD / Tile::WN);  // this warp's first dQ column
#if __CUDA_ARCH__ < 900
            float* dst_row = dst0 + (long long)row * d + (lane % 4) * 2;  // row g, column 2t
#endif
#pragma unroll
            for (int pass = 0; pass < NH / Tile::DQ_PASS; ++pass) {
                float dq[Tile::DQ_PASS][4];
#pragma unroll
                for (int nt = 0; nt < Tile::DQ_PASS; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) dq[nt][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < B_c / 16; ++kk) {
                    unsigned a[4];
                    ldmatrix_x4(a, rd_ds.at(0, 2 * kk) + OFF_DS);
#pragma unroll
                    for (int nd2 = 0; nd2 < Tile::DQ_PASS / 2; ++nd2) {
                        unsigned bk[4];
                        ldmatrix_x4_trans(
                            bk, rd_hpart.at(kk * 16, pass * Tile::DQ_PASS + nd2 * 2) + OFF_K);
                        T::mma(dq[2 * nd2], a, bk[0], bk[1]);
                        T::mma(dq[2 * nd2 + 1], a, bk[2], bk[3]);
                    }
                }
                // Float atomics into dQ_accum; rows past seqlen_q, columns past d skipped.
#pragma unroll
                for (int nt = 0; nt < Tile::DQ_PASS; ++nt) {
                    const int tile_col = (pass * Tile::DQ_PASS + nt) * 8;
                    if (wn * (HD / Tile::WN) + tile_col >= d) break;
                    const float* c = dq[nt];
#if __CUDA_ARCH__ >= 900
                    // 4 consecutive columns per instruction: lanes 2t and 2t+1 swap halves so
                    // that the even lane holds row g and the odd lane row g + 8 of columns
                    // 4 (t / 2) .. 4 (t / 2) + 3.
                    const bool odd = lane & 1;
                    const int my_row = row + (odd ? 8 : 0);
                    const float r0 = shfl_xor(odd ? c[0] : c[2], 1);
                    const float r1 = shfl_xor(odd ? c[1] : c[3], 1);
                    if (my_row < seqlen_q) {
                        float* p = dst0 + (long long)my_row * d + tile_col + ((lane % 4) & ~1) * 2;
                        if (odd) red_add_f32x4(p, r0, r1, c[2], c[3]);
                        else red_add_f32x4(p, c[0], c[1], r0, r1);
                    }
#else
#pragma unroll
                    for (int e2 = 0; e2 < 2; ++e2)
                        if (row + e2 * 8 < seqlen_q)
#pragma unroll
                            for (int e1 = 0; e1 < 2; ++e1)
                                atomicAdd(dst_row + e2 * 8 * d + tile_col + e1, c[e2 * 2 + e1]);
#endif
                }
            }
        };

        for (int i = rb.begin; i < rb.end; ++i) {
            const int buf = QSTAGES == 2 ? (i - rb.begin) & 1 : 0;
            if (QSTAGES == 2) {
                if (i + 1 < rb.end) load_row_block(i + 1, buf ^ 1);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();  // row block i (and K_j, V_j) are in shared memory
            if (block_needs_mask<B_r, B_c, CAUSAL>(i, j, seqlen_q, seqlen_k))
                step(i, buf, Bool<true>{});
            else
                step(i, buf, Bool<false>{});
            __syncthreads();  // every warp is done with buffer `buf`, P_ij and dS_ij
            if (QSTAGES == 1 && i + 1 < rb.end) {
                load_row_block(i + 1, 0);
                cp_async_commit();
            }
        }

        // ---- epilogue: dK_j = scale * dK_j, dV_j, written straight from registers ----------
        const int out_head = expanded ? head : head_k;
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
            const int key = col0 + wm * 16 + lane / 4 + e2 * 8;
            if (key >= seqlen_k) continue;
            const long long base = batch * dk_stride_b + key * dk_stride_s +
                                   out_head * dk_stride_h + wn * (HD / Tile::WN) + (lane % 4) * 2;
#pragma unroll
            for (int nt = 0; nt < NH; ++nt) {
                if (wn * (HD / Tile::WN) + nt * 8 >= d) break;
                const float k0 = dk[nt][e2 * 2] * softmax_scale;
                const float k1 = dk[nt][e2 * 2 + 1] * softmax_scale;
                const float v0 = dv[nt][e2 * 2], v1 = dv[nt][e2 * 2 + 1];
                if (expanded) {
                    float* fk = static_cast<float*>(dK) + base + nt * 8;
                    float* fv = static_cast<float*>(dV) + base + nt * 8;
                    fk[0] = k0; fk[1] = k1;
                    fv[0] = v0; fv[1] = v1;
                } else {
                    *reinterpret_cast<unsigned*>(static_cast<elem_t*>(dK) + base + nt * 8) =
                        T::pack(k0, k1);
                    *reinterpret_cast<unsigned*>(static_cast<elem_t*>(dV) + base + nt * 8) =
                        T::pack(v0, v1);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// dQ = softmax_scale * sum over slices of dQ_accum, in the input dtype
// ---------------------------------------------------------------------------------------------
// One thread per 8 elements of a row; grid (ceil(seqlen_q * d / 8 / 128), heads, batch).
// dQ: (batch, seqlen_q, heads, d) with strides (last dim contiguous).
template <typename T>
__global__ void __launch_bounds__(128)
fa2_backward_dq(const float* __restrict__ dQ_accum, elem_t* __restrict__ dQ, int splits,
                int seqlen_q, int d, long long dq_stride_b, long long dq_stride_s,
                long long dq_stride_h, float softmax_scale) {
    const int head = blockIdx.y, batch = blockIdx.z, nheads = gridDim.y, nbatch = gridDim.z;
    const int chunks = d / 8;
    const long long idx = (long long)blockIdx.x * 128 + threadIdx.x;
    if (idx >= (long long)seqlen_q * chunks) return;
    const int row = idx / chunks, c = idx % chunks;
    const long long slice = (long long)nbatch * nheads * seqlen_q * d;
    const float* src =
        dQ_accum + (((long long)batch * nheads + head) * seqlen_q + row) * d + c * 8;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < splits; ++s) {  // fixed order: deterministic
        const Float4 lo = *reinterpret_cast<const Float4*>(src + s * slice);
        const Float4 hi = *reinterpret_cast<const Float4*>(src + s * slice + 4);
        acc[0] += lo.x; acc[1] += lo.y; acc[2] += lo.z; acc[3] += lo.w;
        acc[4] += hi.x; acc[5] += hi.y; acc[6] += hi.z; acc[7] += hi.w;
    }
    Chunk16 out;
    unsigned* packed = reinterpret_cast<unsigned*>(&out);
#pragma unroll
    for (int e = 0; e < 4; ++e)
        packed[e] = T::pack(acc[2 * e] * softmax_scale, acc[2 * e + 1] * softmax_scale);
    *reinterpret_cast<Chunk16*>(dQ + batch * dq_stride_b + row * dq_stride_s +
                                head * dq_stride_h + c * 8) = out;
}

}  // namespace cuflash
