// fa2_forward.cu: FlashAttention-2 forward, O = softmax(S) V with S = scale * Q K^T,
// on tensor cores (mma.sync m16n8k16, fp32 accumulate), sm_80 and newer.
//
// Algorithm (the seed document, section 2.4.1.1; names as there):
//   one thread block per (row block i of Q, head, batch); T_c column blocks of K/V visited.
//   Q_i (B_r x d) is loaded to shared memory once. For each column block j:
//       S_ij   = Q_i K_j^T                               (tensor cores, registers)
//       m_new  = max(m_i, rowmax(S_ij))
//       P~_ij  = exp(S_ij - m_new)                       (exp2 with log2(e) folded in the scale)
//       l_i    = e^(m_i - m_new) l_i + rowsum(P~_ij)
//       O~_i   = diag(e^(m_i - m_new)) O~_i + P~_ij V_j  (P~ stays in registers: A operand)
//       m_i    = m_new
//   and at the end  O_i = diag(l_i)^-1 O~_i,  L_i = m_i + log(l_i)  (written to HBM once).
//   (LEAN tiles keep m_i until m_new passes it by more than 2^8 in P~: LAZY_RESCALE.)
//
// The pieces it is built from, each in its own header: the rows of a batch entry (seqinfo.cuh),
// which keys a row sees (mask.cuh) and which column blocks a row block visits in which phase
// (block_range.cuh), the score hook applied to S (score.cuh) and the online softmax
// (softmax.cuh). The inner loop is the lambda `step`, under "the FA2 inner loop" below.
//
// Work split inside a block (FlashAttention-2's "split Q"): each of the NWARPS warps owns
// B_r / NWARPS rows of Q_i and reads all of K_j, V_j, so the softmax statistics of a row never
// leave its warp: no shared-memory exchange between warps in the inner loop.
//
// Pipelining (KV_STAGES):
//   1: K_j and V_j each have one shared-memory buffer. V_j is fetched (cp.async) while S_ij is
//      computed, K_{j+1} while O~_i += P~_ij V_j is computed; two barriers per step.
//   2: two buffers each. K_{j+1} and V_{j+1} are fetched at the start of step j, when only O~_i
//      holds registers, and land during the whole step; one barrier per step (SPLIT_V0 tiles:
//      one more in the first step, which waits for V_j only before P~V).
//
// Variants (template parameters; cuflash/_plan.py picks them):
//   T       fp16 | bf16                      element type of Q, K, V, O
//   HD       32, 64, ..., 256                 head-dim bucket; the real d (<= HD) is zero-padded
//                                            inside shared memory
//   Tile = ForwardTile<HD, B_r, B_c, NWARPS, KV_STAGES>: tile shape and K/V buffers; wrapped in
//          OddD<...> (common.cuh) where d is not a multiple of 8: element-wise loads and stores
//   MaskT = Mask<CAUSAL, LOCAL>              which keys each row sees (mask.cuh); causal blocks
//                                            fully above the diagonal are skipped
//   ScoreT = ScoreScale | ScoreHook          the score hook (score.cuh): softcap and ALiBi
//   SeqT = DenseSeq | PackedSeq              batch layout (seqinfo.cuh): packed = variable length
#include "common.cuh"
#include "params.cuh"
#include "seqinfo.cuh"
#include "mask.cuh"
#include "block_range.cuh"
#include "score.cuh"
#include "softmax.cuh"

namespace cuflash {

// ---------------------------------------------------------------------------------------------
// Tile shape and the quantities derived from it
// ---------------------------------------------------------------------------------------------
template <int HD_, int B_r_, int B_c_, int NWARPS_, int KV_STAGES_>
struct ForwardTile {
    static constexpr int HD = HD_, B_r = B_r_, B_c = B_c_, NWARPS = NWARPS_;
    static constexpr int KV_STAGES = KV_STAGES_;
    static constexpr int NTHREADS = NWARPS * 32;
    static constexpr int ROWS_PER_WARP = B_r / NWARPS;
    static constexpr int MT = ROWS_PER_WARP / 16;  // m16 tiles of rows per warp
    static constexpr int NT_S = B_c / 8;           // n8 tiles across S_ij
    static constexpr int NT_O = HD / 8;             // n8 tiles across O~_i
    static constexpr int KS_QK = HD / 16;           // k16 steps of Q_i K_j^T
    static constexpr int KS_PV = B_c / 16;         // k16 steps of P~_ij V_j
    // Where the O~_i and S_ij accumulators take 192 of the 255 registers or more (d = 128 at
    // 32 rows per warp), the row sums and the loop bounds leave the registers (the softmax's
    // l_own, softmax.cuh, and s_bounds in the kernel). Only there: elsewhere the extra
    // shuffles and shared-memory loads cost 5-10% (measured at d 32-96).
    static constexpr bool LEAN = MT * (NT_O + NT_S) * 4 >= 192;
    // LEAN tiles also (each measured on the H200 d 128 tile, two K/V stages, against FA2:
    // both together +2-4%; on the other tiles the lazy rescaling's branch cost 3-10%):
    //   LAZY_RESCALE  m_i moves only when a row max passes it by more than 2^RESCALE_LOG2 in
    //                 P~, so the O~_i *= e^(m_i - m_new) multiplies are mostly skipped;
    //   SPLIT_V0      the first V_j is a cp.async group of its own: the first step computes
    //                 S_ij as soon as Q_i and K_j are in and waits for V_j only before P~V.
    static constexpr bool LAZY_RESCALE = LEAN;
    // REBUILD (32 rows per warp): the ldmatrix readers and the K/V pointers are rebuilt where
    // they are used, from opaque copies of the lane index, batch and head, instead of being
    // held in registers through the loop beside O~_i and S_ij.
    static constexpr bool REBUILD = MT > 1;
    // Head dims that are not a multiple of 8: element-wise loads and stores (OddD<Tile>,
    // common.cuh).
    static constexpr bool ODD_D = false;
    // (cuflash/_plan.py's ForwardConfig mirrors LEAN and REBUILD; the compile check asserts
    // they agree.)
    static constexpr int RESCALE_LOG2 = 8;
    static constexpr bool SPLIT_V0 = LEAN && KV_STAGES == 2;
    // Shared memory, in bytes: Q_i (B_r x HD), KV_STAGES x (K_j, V_j) (B_c x HD each), 16-bit.
    // (cuflash/_plan.py's ForwardConfig.smem_bytes; the compile check asserts they agree.)
    static constexpr int SMEM_BYTES = 2 * (B_r + 2 * KV_STAGES * B_c) * HD;
    // Thread blocks per SM the register file is planned for: O~_i and S_ij accumulators plus
    // about 64 registers of addresses, fragments and softmax state per thread (16 more for the
    // causal mask, 16 for a packed batch's entry lengths and offsets, 8 for the second K/V
    // stage). Passed to __launch_bounds__ so that ptxas aims at that occupancy (left to itself
    // it aimed small tiles at 96 registers and spilled).
    static constexpr int regs_est(bool causal, bool packed = false) {
        return MT * (NT_O + NT_S) * 4 + 64 + (causal ? 16 : 0) + (packed ? 16 : 0) +
               (KV_STAGES == 2 ? 8 : 0);
    }
    static constexpr int min_blocks(bool causal, bool packed = false) {
        return 65536 / (NWARPS * 32 * ((regs_est(causal, packed) + 7) / 8 * 8)) < 1 ? 1
             : 65536 / (NWARPS * 32 * ((regs_est(causal, packed) + 7) / 8 * 8));
    }

    static_assert(HD % 32 == 0 && HD <= 256, "head-dim bucket must be a multiple of 32, <= 256");
    static_assert(B_r % (16 * NWARPS) == 0, "each warp owns whole m16 tiles of rows");
    static_assert(MT >= 1 && MT <= 2, "1 or 2 m16 tiles per warp");
    static_assert(B_c % 16 == 0, "B_c is a whole number of k16 steps of P V");
    static_assert(KV_STAGES == 1 || KV_STAGES == 2, "1 or 2 buffers for K_j, V_j");
};

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------
// Q, K, V: (batch, seqlen, heads, d) with arbitrary strides in elements (the last dim is
// contiguous); q head h reads kv head h / group (MQA/GQA). O has Q's shape (its own strides);
// L is float32 (batch, heads, seqlen_q), contiguous.
template <typename T, typename Tile, typename MaskT, typename ScoreT = ScoreScale,
          typename SeqT = DenseSeq>
__global__ void __launch_bounds__(Tile::NTHREADS, Tile::min_blocks(MaskT::CAUSAL, SeqT::PACKED))
fa2_forward(const FwdParams p) {
    constexpr int HD = Tile::HD, B_r = Tile::B_r, B_c = Tile::B_c;
    constexpr int KV_STAGES = Tile::KV_STAGES;
    constexpr int NTHREADS = Tile::NTHREADS, RPW = Tile::ROWS_PER_WARP, MT = Tile::MT;
    constexpr int NT_S = Tile::NT_S, NT_O = Tile::NT_O;
    constexpr bool LEAN = Tile::LEAN;
    using Score = ScoreT;
    // The parameters, read once here: the loads in the loop take them from these locals.
    // (Reading p's fields inside the lambdas instead gave the same instructions in another
    // schedule, 4-6% slower at d 64 and d 256 on the H200: PERFORMANCE.md, 2026-11-30.)
    const elem_t* Q = p.q;
    const elem_t* K = p.k;
    const elem_t* V = p.v;
    elem_t* O = p.o;
    float* L = p.lse;
    const int d = p.d, group = p.group;
    const long long q_stride_b = p.q_stride_b, q_stride_s = p.q_stride_s, q_stride_h = p.q_stride_h;
    const long long k_stride_b = p.k_stride_b, k_stride_s = p.k_stride_s, k_stride_h = p.k_stride_h;
    const long long v_stride_b = p.v_stride_b, v_stride_s = p.v_stride_s, v_stride_h = p.v_stride_h;
    const long long o_stride_b = p.o_stride_b, o_stride_s = p.o_stride_s, o_stride_h = p.o_stride_h;

    // One dynamic shared buffer carved into the three tiles.
    extern __shared__ __attribute__((aligned(128))) elem_t smem[];
    elem_t* sQ = smem;           // (B_r, HD)  Q_i, later the staging area of O_i
    elem_t* sK = sQ + B_r * HD;  // KV_STAGES x (B_c, HD)  K_j
    elem_t* sV = sK + KV_STAGES * B_c * HD;  // KV_STAGES x (B_c, HD)  V_j
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    // ldmatrix lane addressing (see the fragment layouts in the inner loop):
    //   Q_i (A, row-major):   lane reads row (lane % 8) + 8 * ((lane / 8) % 2), chunk lane / 16
    //   K_j (B, K^T columns): lane reads row (lane % 8) + 8 * (lane / 16),     chunk (lane / 8) % 2
    //   V_j (B, .trans):      lane reads row (lane % 8) + 8 * ((lane / 8) % 2), chunk lane / 16
    // At 32 rows per warp the readers are built where they are used, from an opaque copy of the
    // lane index, so that their 12 registers are not held across the loop beside O~_i and S_ij
    // (see `opaque`); at 16 rows per warp there is room to keep them.
    auto rows_first = [&](const elem_t* tile) {
        const int l = Tile::REBUILD ? opaque(lane) : lane;
        return SwizzledReader<HD>(smem_u32(tile), lane_row_rows_first(l), lane_chunk_rows_first(l));
    };
    auto chunks_first = [&](const elem_t* tile) {
        const int l = Tile::REBUILD ? opaque(lane) : lane;
        return SwizzledReader<HD>(smem_u32(tile), lane_row_chunks_first(l),
                                  lane_chunk_chunks_first(l));
    };
    // Causal row blocks near the bottom visit the most column blocks: launch them first.
    const int row_block = MaskT::CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int head = blockIdx.y, batch = blockIdx.z, nheads = gridDim.y;
    const int head_k = head / group;
    const SeqInfo seq = SeqT::info(p, batch);  // this batch entry's rows
    const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
    const MaskT mask(p, seqlen_q, seqlen_k);
    const Score score(p, batch, head);
    const int row0 = row_block * B_r;  // first query row of Q_i
    const int chunks = d / 8;          // 16-byte chunks of real data per row
    if (SeqT::PACKED && row0 >= seqlen_q) return;  // (an entry shorter than the grid's rows)

    const elem_t* q = Q + seq.q_offset(q_stride_b, q_stride_s) + row0 * q_stride_s +
                      head * q_stride_h;
    // K_j, V_j: HBM -> shared (cp.async; caller commits). At 32 rows per warp the pointers are
    // rebuilt per call from the kernel arguments rather than held in registers.
    auto load_kv = [&](elem_t* dst, const elem_t* base, long long stride_b, long long stride_h,
                       long long stride_s, int col0) {
        const SeqInfo s = SeqT::info(p, Tile::REBUILD ? opaque(batch) : batch);
        const long long hk = Tile::REBUILD ? opaque(head_k) : head_k;
        // (32 rows per warp: the flat-index loader, which holds fewer registers; at d = 96
        // the segmented one spilled)
        load_tile<Tile, B_c, HD, NTHREADS, MT == 1>(
            dst, base + s.k_offset(stride_b, stride_s) + hk * stride_h + col0 * stride_s,
            stride_s, seqlen_k - col0, chunks, d, Tile::REBUILD ? opaque(tid) : tid);
    };
    auto load_k = [&](elem_t* dst, int col0) {
        load_kv(dst, K, k_stride_b, k_stride_h, k_stride_s, col0);
    };
    auto load_v = [&](elem_t* dst, int col0) {
        load_kv(dst, V, v_stride_b, v_stride_h, v_stride_s, col0);
    };

    const ColumnBlocks cb = column_blocks<B_r, B_c>(mask, row_block);
    // LEAN tiles read the loop bounds from shared memory at each test instead of holding them
    // in two registers through the loop (with O~_i and S_ij live, they were among the values
    // spilled at d = 128).
    __shared__ int s_bounds[2];  // cb.masked_begin, cb.end
    if (LEAN && tid == 0) {
        s_bounds[0] = cb.masked_begin;
        s_bounds[1] = cb.end;
    }
    if (LEAN) __syncthreads();
    auto masked_begin = [&] {
        return LEAN ? ld_shared_s32(smem_u32(s_bounds)) : cb.masked_begin;
    };
    auto end = [&] { return LEAN ? ld_shared_s32(smem_u32(s_bounds + 1)) : cb.end; };

    // Q_i: HBM -> shared, with K_{begin} in the same cp.async group.
    // With two K/V stages, V_{begin} joins them (step j only waits for what step j - 1 issued),
    // except on SPLIT_V0 tiles, where it is a group of its own.
    load_tile<Tile, B_r, HD, NTHREADS, MT == 1>(sQ, q, q_stride_s, seqlen_q - row0, chunks, d,
                                                tid);
    // Column block j uses K/V buffer j % KV_STAGES.
    if (cb.begin < cb.end) {
        const int first = KV_STAGES == 2 ? (cb.begin & 1) * B_c * HD : 0;
        load_k(sK + first, cb.begin * B_c);
        if (KV_STAGES == 2 && !Tile::SPLIT_V0)
            load_v(sV + first, cb.begin * B_c);
    }
    cp_async_commit();
    if (Tile::SPLIT_V0) {  // V_{begin} in a group of its own, awaited before the first P~V
        if (cb.begin < cb.end)
            load_v(sV + (cb.begin & 1) * B_c * HD, cb.begin * B_c);
        cp_async_commit();
    }

    // Per-thread state. Accumulator fragment layout of mma m16n8k16: lane holds rows
    // g = lane / 4 and g + 8 (index [e / 2]) and columns 2 * (lane % 4) + (e % 2) of a 16x8 tile.
    float o[MT][NT_O][4];  // O~_i, unscaled
    zero(o);
    // m_i, l_i (softmax.cuh; LEAN tiles keep l_i in one register per lane, LAZY_RESCALE moves
    // m_i only when a row max passes it by more than 2^8 in P~)
    OnlineSoftmax<MT, NT_S, NT_O, LEAN, Tile::LAZY_RESCALE, Tile::RESCALE_LOG2> softmax;

    // ---- the FA2 inner loop: one step per column block j ----------------------------------
    auto step = [&](int j, auto masked, bool first) {
        constexpr bool MASK = decltype(masked)::value;
        const int col0 = j * B_c;  // first key column of K_j
        // This step's K_j, V_j buffers (element offset into sK, sV)
        const int stage = KV_STAGES == 2 ? (j & 1) * B_c * HD : 0;
        if (Tile::SPLIT_V0 && first)
            cp_async_wait<1>();  // Q_i, K_j (V_j may still be in flight)
        else
            cp_async_wait<0>();
        __syncthreads();  // K_j (and V_j) in shared memory; every warp is done with step j - 1
        if (KV_STAGES == 2) {
            // K_{j+1}, V_{j+1}: HBM -> the other buffers, overlapping this whole step.
            if (j + 1 < end()) {
                const int next = B_c * HD - stage;
                load_k(sK + next, col0 + B_c);
                load_v(sV + next, col0 + B_c);
            }
        } else {
            // V_j: HBM -> shared, overlapping S_ij = Q_i K_j^T below.
            load_v(sV, col0);
        }
        cp_async_commit();

        // S_ij = Q_i K_j^T: (RPW x B_c) per warp. A = Q_i rows (ldmatrix), B = K_j rows
        // (ldmatrix without .trans: a row of K is a column of K^T).
        float s[MT][NT_S][4];
        zero(s);
        const SwizzledReader<HD> readQ = rows_first(sQ + warp * RPW * HD);
        const SwizzledReader<HD> readK = chunks_first(sK + stage);
        // Grouped k loop only at 32 rows per warp, where O~_i and S_ij leave no registers for
        // hoisted fragments (measured: grouping costs 13% at 16 rows per warp, d = 128), and
        // only over whole groups of 4 k steps (d = 96 measured with all 6 unrolled).
        // k step kk + 4 g = head-dim chunks 2 kk + 8 g
        warp_mma<T, Tile::KS_QK, (MT > 1 && Tile::KS_QK % 4 == 0)>(
            s,
            [&](unsigned (&a)[4], int mt, int kk, int g) {
                ldmatrix_x4(a, readQ.at(mt * 16, kk * 2) + g * 128);
            },
            [&](unsigned (&b)[4], int nt2, int kk, int g) {  // n8 tiles 2 nt2, 2 nt2 + 1
                ldmatrix_x4(b, readK.at(nt2 * 16, kk * 2) + g * 128);
            });

        // The score hook (score.cuh): S_ij as the softmax sees it (nothing to do for the scale
        // alone, which the softmax folds into its exponent). ALiBi's part per row and lane is
        // left out of S where the block lies on one side of the diagonal, in row_bias, for the
        // softmax to add back (0 elsewhere); outside the causal mask at d 64 only.
        constexpr bool ROW_BIAS = Score::template has_row_bias<HD, MaskT>();
        float row_bias[MT][2];
        if constexpr (Score::REWRITES) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float dist[2];  // (the lane's two rows, at its first column)
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2)
                    dist[e2] = score.template diagonal<shifted_diagonal<SeqT, MaskT>()>(
                        p, row0 + warp * RPW + mt * 16 + lane / 4 + e2 * 8,
                        col0 + (lane % 4) * 2, seqlen_q, seqlen_k);
                score.template apply_fragment<HD, MaskT>(p, s[mt], dist, row_bias[mt]);
            }
        }

        // Mask (only on blocks that cross a mask limit or the end of K, mask.cuh):
        // S_ij[r, c] = -inf where key c is not visible from query r.
        if (MASK) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                mask_fragment(mask, s[mt], row0 + warp * RPW + mt * 16 + lane / 4, col0, lane);
        }

        // Online softmax (softmax.cuh): m_new = max(m_i, rowmax(S_ij)),
        // P~_ij = exp(scale (S_ij - m_new)) in place of S_ij, l_i and O~_i rescaled.
        softmax.template update<ROW_BIAS>(s, o, score.exp2_scale, lane, row_bias);

        if (KV_STAGES == 1) {
            cp_async_wait<0>();
            __syncthreads();  // V_j is in shared memory; every warp is done reading K_j
            // K_{j+1}: HBM -> shared, overlapping O~_i += P~_ij V_j below.
            if (j + 1 < end()) load_k(sK, col0 + B_c);
            cp_async_commit();
        }

        // O~_i += P~_ij V_j. The S accumulators of n8 tiles 2kk and 2kk+1 are exactly the A
        // fragment of a 16x16 tile of P~, so P~ goes from registers straight into the mma.
        // B = V_j rows read with ldmatrix .trans.
        if (Tile::SPLIT_V0 && first) {
            cp_async_wait<1>();
            __syncthreads();  // V_j is in shared memory
        }
        const SwizzledReader<HD> readV = rows_first(sV + stage);
        warp_mma<T, Tile::KS_PV, false>(  // k step kk = keys 16 kk; P~ indexed at compile time
            o,
            [&](unsigned (&p)[4], int mt, int kk, int) {
                // At 32 rows per warp, a warp barrier per k step bounds how far ptxas hoists
                // V_j fragment loads ahead of the MMAs (kept as measured; its effect on
                // registers was not isolated).
                if (MT > 1 && kk > 0 && mt == 0) __syncwarp();
                pack_a_fragment<T>(p, s[mt], kk);
            },
            [&](unsigned (&b)[4], int nd2, int kk, int) {  // head-dim tiles 2 nd2, 2 nd2 + 1
                ldmatrix_x4_trans(b, readV.at(kk * 16, nd2 * 2));
            });
    };
    // The three phases of the column blocks (block_range.cuh): masked on the left (a lower key
    // limit; only masks with one have it), whole, masked on the right (the causal diagonal,
    // the ragged end of K).
    int j = cb.begin;
    bool first = true;  // step j == cb.begin (SPLIT_V0 waits for V_j separately there)
    if constexpr (MaskT::LOCAL) {
        // (sliding windows: every visited block through the masked step, one copy of its
        // code; a second, unmasked copy for the window's inside pushed the tightest tiles
        // into spills)
        for (; j < end(); ++j, first = false) step(j, Bool<true>{}, first);
    } else {
        for (; j < masked_begin(); ++j, first = false)
            step(j, Bool<false>{}, first);  // blocks every row sees whole
        for (; j < end(); ++j, first = false)
            step(j, Bool<true>{}, first);   // diagonal / ragged-end blocks
    }

    // ---- epilogue: O_i = diag(l_i)^-1 O~_i, L_i = m_i + log(l_i) ---------------------------
    // A row block that sees no key (causal, seqlen_q > seqlen_k) visits no column block, and
    // its Q_i copies may still be in flight: they were issued by every thread of the block, so
    // a warp's own wait does not cover the rows it stages O_i through below. Wait, then let
    // the whole block pass a barrier (once per block; testing for that case instead kept the
    // loop bounds in registers, and spilled at d 256).
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
            // (l_i = 0: the row saw no key, O = 0 and L = -inf; a NaN l_i stays NaN in both)
            const float l_row = softmax.row_sum(mt, e2, lane);
            softmax.normalise(o, mt, e2, l_row);
            const int row = row0 + warp * RPW + mt * 16 + lane / 4 + e2 * 8;
            if (lane % 4 == 0 && row < seqlen_q)
                L[seq.row_vector(head, nheads) + row] =
                    softmax.lse(mt, e2, l_row, score.lse_scale);
        }

    // Stage O_i through this warp's own rows of the Q_i tile (no other warp reads them), then
    // write 16-byte vectors, coalesced along each row.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
            const int r = warp * RPW + mt * 16 + lane / 4 + e2 * 8;
#pragma unroll
            for (int nt = 0; nt < NT_O; ++nt) {
                const unsigned packed = T::pack(o[mt][nt][e2 * 2], o[mt][nt][e2 * 2 + 1]);
                *reinterpret_cast<unsigned*>(sQ + tile_offset<HD>(r, nt) + (lane % 4) * 2) = packed;
            }
        }
    __syncwarp();
    elem_t* out = O + seq.q_offset(o_stride_b, o_stride_s) + head * o_stride_h;
    constexpr int NC = HD / 8;
#pragma unroll
    for (int i = lane; i < RPW * NC; i += 32) {
        const int r = warp * RPW + i / NC, c = i % NC;
        if constexpr (Tile::ODD_D) {  // (the elements < d of chunks that start before d)
            if (row0 + r < seqlen_q && c * 8 < d)
                store_chunk_elementwise(out + (row0 + r) * o_stride_s, c, d,
                                        *reinterpret_cast<const Chunk16*>(sQ + tile_offset<HD>(r, c)));
        } else if (row0 + r < seqlen_q && c < chunks) {
            *reinterpret_cast<Chunk16*>(out + (row0 + r) * o_stride_s + c * 8) =
                *reinterpret_cast<const Chunk16*>(sQ + tile_offset<HD>(r, c));
        }
    }
}

}  // namespace cuflash
