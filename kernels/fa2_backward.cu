// fa2_backward.cu: FlashAttention-2 backward (recompute), on tensor cores (mma.sync m16n8k16,
// fp32 accumulate), sm_80 and newer. Three kernels, launched in this order (the first and the
// last in backward_passes.cuh, which the Hopper backward shares):
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
//       dQ_i += dS_ij K_j                         (added into float32 dQ_accum; times scale in
//                                                  fa2_backward_dq)
// Causal: row blocks entirely above the diagonal of column block j are never visited, and the
// mask is applied only on blocks that cross it (block_range.cuh).
//
// Work split: B_r x B_c per step (64 x 128 at d = 128, as FlashAttention-2 uses). Each of the
// three kinds of product (S and dP; dK and dV; dQ) has its own warp layout (BackwardTile).
// S and dP stay in the registers of the warp that computes them; P and dS go through shared
// memory so that the dV, dK and dQ products can read them, transposed where needed
// (ldmatrix .trans), with their own warp split.
//
// Adding dQ_i into dQ_accum (DQ_BULK): the sum over column blocks is the costliest traffic of
// the kernel (measured: without it the kernel runs 15-20% faster).
//   0 (sm_80+):  float atomics straight from the registers (RED); dQ_accum row-major.
//   1, 2 (sm_90+): each warp stores its dQ_ij fragments to a shared-memory tile (DQ_BULK tiles,
//                used in turn), and one thread hands the whole tile to the copy engine as one
//                bulk reduction (cp.reduce.async.bulk .add.f32), which runs while the next
//                steps compute. The tile is stored in fragment order (dq_fragment), so the
//                shared-memory stores are conflict-free 16-byte vectors; fa2_backward_dq_bulk
//                undoes the order.
//
// Deterministic mode: the additions into each element of dQ_accum happen in an order fixed in
// advance, so the sums come out the same on every run. Two schemes:
//   ORDERED (with DQ_BULK, sm_90+): one column block per thread block as in the default mode,
//     block x of a (batch, head) taking j = T_c - 1 - x. The column blocks that see row block
//     i add into it right to left: j = n_i - 1 (rank 0, which stores instead of adding: no
//     zeroing), then n_i - 2, ..., 0, where n_i = column_blocks(i).end. A counter per (batch,
//     head, row block) in dQ_order says whose turn it is: block j waits until it reads its
//     rank, issues its bulk reduction, and once that has completed (checked half a step later)
//     sets it to rank + 1. A block only ever waits for the block x - 1 of its (batch, head),
//     where x is a ticket the block takes when it starts (an atomic counter per (batch, head)):
//     block x - 1 took its ticket first, so it holds an SM and will finish, whatever order the
//     GPU starts blocks in (CUDA promises none). Causal: grid (T_c, heads, batch);
//     right to left is also the order in which the blocks reach a row block (column blocks
//     further right start further down), so they rarely wait. Non-causal: every block starts
//     at row block 0, so block x would trail block x - 1 by a hand-off at every row block;
//     grid (heads, batch, T_c) instead starts block x of every (batch, head) before any block
//     x + 1, and the blocks of one (batch, head) start far enough apart not to wait
//     (PERFORMANCE.md has the measurements of both orders for both masks). A template
//     parameter rather than a run-time flag: as a flag it cost the default kernels 1-3.5%.
//   splits (`deterministic` = 1, dQ atomics): gridDim.x is a fixed number of splits; block x
//     handles one column block of each round of gridDim.x (x, x + gridDim.x, ...; causal: the
//     x-th from the end of odd rounds) and owns slice x of dQ_accum, each element of which is
//     then updated by one thread only, in program order; fa2_backward_dq adds the slices in a
//     fixed order.
// Otherwise gridDim.x = T_c, block x takes column block x, and all blocks add into one zeroed
// dQ_accum in whatever order the additions land.
//
// Variants: T (fp16 | bf16), HD (head-dim bucket), B_r, B_c, NWARPS, the three warp layouts
// (WM_SDP, WM_DKV, WM_DQ), QSTAGES (1 or 2 shared-memory buffers for Q_i, dO_i, L_i, D_i; row
// block i + 1 loads during step i: with 2, Q, L, D from its start and dO after dV_j += P_ij^T
// dO_i; with 1, all of it after dK_j += dS_ij^T Q_i, during the dQ product),
// DQ_BULK, CAUSAL, ORDERED, ScoreT, SeqT (DenseSeq | PackedSeq, seqinfo.cuh: variable-length
// batches, without the ordered mode); the tile wrapped in OddD<...> (common.cuh) where d is not
// a multiple of 8 (element-wise loads and stores). cuflash/_plan.py picks them per head dim and
// GPU.
#include "common.cuh"
#include "params.cuh"
#include "seqinfo.cuh"
#include "mask.cuh"
#include "block_range.cuh"
#include "score.cuh"
#include "backward_passes.cuh"

namespace cuflash {

// ---------------------------------------------------------------------------------------------
// Tile shape and warp layouts
// ---------------------------------------------------------------------------------------------
// The three kinds of product in a step split their (M x N) output over the NWARPS warps in
// different ways, each chosen so that a warp owns a tile at least 32 wide in M and N where
// registers allow: shared-memory reads per MMA fall as 1/M_w + 1/N_w, and they, not the
// tensor cores, bound this kernel (PERFORMANCE.md).
//   S, dP    (B_r x B_c):  WM_SDP warps along the query rows, the rest along the keys
//   dK, dV   (B_c x HD):   WM_DKV warps along the keys, the rest along the head dim
//   dQ       (B_r x HD):   WM_DQ warps along the query rows, the rest along the head dim
template <int HD_, int B_r_, int B_c_, int NWARPS_, int WM_SDP_, int WM_DKV_, int WM_DQ_,
          int QSTAGES_, int DQ_BULK_>
struct BackwardTile {
    static constexpr int HD = HD_, B_r = B_r_, B_c = B_c_, NWARPS = NWARPS_, QSTAGES = QSTAGES_;
    static constexpr int WM_SDP = WM_SDP_, WM_DKV = WM_DKV_, WM_DQ = WM_DQ_;
    static constexpr int DQ_BULK = DQ_BULK_;
    static constexpr int NTHREADS = NWARPS * 32;
    // Per-warp tile of S, dP: S_MW query rows x S_NW keys = S_MT m16 x S_NT n8 mma tiles.
    static constexpr int S_MW = B_r / WM_SDP, S_NW = B_c / (NWARPS / WM_SDP);
    static constexpr int S_MT = S_MW / 16, S_NT = S_NW / 8;
    // Per-warp tile of dK, dV: KV_MW keys x KV_NW head-dim columns.
    static constexpr int KV_MW = B_c / WM_DKV, KV_NW = HD / (NWARPS / WM_DKV);
    static constexpr int KV_MT = KV_MW / 16, KV_NT = KV_NW / 8;
    // Per-warp tile of dQ: Q_MW query rows x Q_NW head-dim columns, computed in passes of
    // DQ_PASS n8 tiles so that few accumulators are live next to dK_j and dV_j (at most 32;
    // 16 at HD > 128, where dK_j and dV_j leave no more).
    static constexpr int Q_MW = B_r / WM_DQ, Q_NW = HD / (NWARPS / WM_DQ);
    static constexpr int Q_MT = Q_MW / 16, Q_NT = Q_NW / 8;
    // Row pitch of the K_j, V_j, Q_i, dO_i tiles in shared memory, in elements. A warp's
    // head-dim part may start inside a swizzle group (chunk offset, SwizzledReader) only where
    // the row is whole 8-chunk groups; a head dim that is not (96, 160, 224) and is split
    // across warps is laid out in the next multiple of 64, whose tail is never read. The math
    // (k loops, warp tiles, dQ_accum) runs over HD alone.
    static constexpr bool SPLIT_HD = KV_NW != HD || Q_NW != HD;
    static constexpr int PITCH = SPLIT_HD ? (HD + 63) / 64 * 64 : HD;
    static constexpr int DQ_TILES = HD > 128 ? 4 : 8;  // m16n8 accumulator tiles per pass
    static constexpr int DQ_PASS = Q_MT * Q_NT <= DQ_TILES ? Q_NT
                                 : Q_NT % 4 == 0 && Q_MT * 4 <= DQ_TILES ? 4 : 2;
    static constexpr int DQ_PASSES = Q_NT / DQ_PASS;
    // The warp-level k loops run grouped (k_loop) where registers are short: above HD = 64
    // (ungrouped there spills; at HD <= 64 ungrouped is up to 4% faster, PERFORMANCE.md).
    static constexpr bool GROUP_K = HD > 64;
    // The k loop over the head dim (S, dP) runs grouped where it is whole groups of 4 steps,
    // or with a 2-step tail above HD = 128; at HD = 96 the 6 steps unroll (grouped, spills).
    static constexpr bool GROUP_HD = HD % 64 == 0 || HD > 128;
    // Without the bulk dQ path (sm_80) a warp barrier between the k steps of dP = dO V^T stops
    // ptxas from hoisting fragments of later steps next to P_ij (kept in registers; else it
    // spills).
    static constexpr bool DP_FENCE = DQ_BULK == 0;
    // Register workarounds of the kernel body (cuflash/_plan.py's BackwardConfig mirrors them;
    // the compile check asserts they agree):
    // REBUILD: the ldmatrix readers are built at the start of each product phase; with
    //   registers to spare the compiler hoists them out of the loop, but at HD > 128 they are
    //   rebuilt from an opaque copy of the lane index (a few integer ops per phase), so that
    //   only the two a phase uses are live.
    static constexpr bool REBUILD = HD > 128;
    // Head dims that are not a multiple of 8: element-wise loads and stores (OddD<Tile>,
    // common.cuh).
    static constexpr bool ODD_D = false;
    // n8 tiles per thread of the dQ pass (fa2_backward_dq_bulk): one, 4-byte stores
    static constexpr int DQ_VEC = 1;
    // OPAQUE_ROWS: d 64 in layout 4/4/4 runs at 255 registers: there the row-block indices
    //   (loader, buffer parity, mask test) and the range of row blocks come from opaque copies;
    //   otherwise ptxas derives them from values it then holds through the loop, and spills
    //   4-84 bytes.
    static constexpr bool OPAQUE_ROWS = HD == 64 && WM_SDP == 4;
    // Shared memory, in bytes (BackwardConfig.smem_bytes; the compile check asserts they agree).
    static constexpr int TILE_KV = B_c * PITCH * 2;  // K_j, V_j
    static constexpr int TILE_Q = B_r * PITCH * 2;   // Q_i, dO_i (QSTAGES copies each)
    static constexpr int TILE_P = B_r * B_c * 2;  // P_ij, dS_ij
    static constexpr int VEC = B_r * 4;           // L_i, D_i (QSTAGES copies each)
    static constexpr int TILE_DQ = B_r * HD * 4;  // dQ_ij, float32 (DQ_BULK copies)
    static constexpr int SMEM_BYTES =
        2 * TILE_KV + QSTAGES * (2 * TILE_Q + 2 * VEC) + 2 * TILE_P + DQ_BULK * TILE_DQ;

    // DQ_BULK: element offset, within a row block's B_r x HD tile of dQ_accum, of m16n8 tile
    // (mt, nt) of dQ pass `pass` of warp `warp`, lane `lane` (4 floats: rows g, g + 8 and
    // columns 2t, 2t + 1 of the tile, g = lane / 4, t = lane % 4; fa2_backward_dq_bulk
    // inverts it).
    static __device__ __forceinline__ int dq_fragment(int warp, int pass, int mt, int nt,
                                                      int lane) {
        return ((((warp * DQ_PASSES + pass) * Q_MT + mt) * DQ_PASS + nt) * 32 + lane) * 4;
    }

    static_assert(HD % 32 == 0 && HD <= 256, "head-dim bucket must be a multiple of 32, <= 256");
    static_assert(B_r % 64 == 0 && B_c % 64 == 0, "B_r, B_c: multiples of 64");
    static_assert(NWARPS % WM_SDP == 0 && NWARPS % WM_DKV == 0 && NWARPS % WM_DQ == 0,
                  "warp layouts must tile the warps");
    static_assert(S_MW % 16 == 0 && S_NW % 16 == 0 && KV_MW % 16 == 0 && KV_NW % 16 == 0 &&
                  Q_MW % 16 == 0 && Q_NW % 16 == 0, "per-warp tiles: multiples of 16");
    static_assert(Q_NT % DQ_PASS == 0 && DQ_PASS % 2 == 0, "dQ passes");
    static_assert(QSTAGES == 1 || QSTAGES == 2, "1 or 2 buffers for the row block");
    static_assert(DQ_BULK >= 0 && DQ_BULK <= 2, "0 (atomics), 1 or 2 dQ tiles");
};

// ---------------------------------------------------------------------------------------------
// The main backward kernel
// ---------------------------------------------------------------------------------------------
// Q, dO: (batch, seqlen_q, heads, d); K, V: (batch, seqlen_k, heads_k, d), any strides with a
// contiguous last dim; query head h reads kv head h / group. L, Dsum: (batch, heads, seqlen_q)
// float32. dQ_accum: (splits, batch, heads, seqlen_q, HD) float32, zeroed; with DQ_BULK
// (batch, heads, T_r, B_r * HD), T_r = ceil(seqlen_q / B_r), in fragment order (zeroed unless
// ORDERED). dQ_order: ORDERED, (batch, heads, T_r) int32, zeroed.
// GQA / MQA: the grid's head dimension enumerates (kv head, part), head_parts parts per kv
// head. A block of kv head hk and part p keeps K_j, V_j and dK_j, dV_j of head hk and walks
// the group / head_parts query heads hk * group + p * (group / head_parts) + 0, 1, ... in turn,
// all their row blocks each, so dK_j, dV_j come out summed over those query heads in
// registers. dK, dV: with head_parts == 1, in the input dtype (batch, seqlen_k, heads_k, d);
// with head_parts > 1 (used where one part per kv head would leave SMs idle), float32 slices
// (head_parts, batch, seqlen_k, heads_k, d), contiguous, which the caller sums.
template <typename T, typename Tile, typename MaskT, bool ORDERED, typename ScoreT = ScoreScale,
          typename SeqT = DenseSeq>
__global__ void __launch_bounds__(Tile::NTHREADS, 1)
fa2_backward(const BwdParams p) {
    constexpr bool CAUSAL = MaskT::CAUSAL;
    using Score = ScoreT;
    constexpr int HD = Tile::HD, B_r = Tile::B_r, B_c = Tile::B_c;
    constexpr int WM_SDP = Tile::WM_SDP, WM_DKV = Tile::WM_DKV, WM_DQ = Tile::WM_DQ;
    constexpr int QSTAGES = Tile::QSTAGES, DQ_BULK = Tile::DQ_BULK;
    const elem_t* __restrict__ Q = p.q;
    const elem_t* __restrict__ K = p.k;
    const elem_t* __restrict__ V = p.v;
    const elem_t* __restrict__ dO = p.dout;
    const float* __restrict__ L = p.lse;
    const float* __restrict__ Dsum = p.dsum;
    float* __restrict__ dQ_accum = p.dq_accum;
    int* __restrict__ dQ_order = p.dq_order;
    void* __restrict__ dK = p.dk;
    void* __restrict__ dV = p.dv;
    const int deterministic = p.deterministic, nheads = p.nheads, head_parts = p.head_parts;
    const int d = p.d, group = p.group;
    const long long q_stride_b = p.q_stride_b, q_stride_s = p.q_stride_s, q_stride_h = p.q_stride_h;
    const long long k_stride_b = p.k_stride_b, k_stride_s = p.k_stride_s, k_stride_h = p.k_stride_h;
    const long long v_stride_b = p.v_stride_b, v_stride_s = p.v_stride_s, v_stride_h = p.v_stride_h;
    const long long do_stride_b = p.do_stride_b, do_stride_s = p.do_stride_s,
                    do_stride_h = p.do_stride_h;
    const long long dk_stride_b = p.dk_stride_b, dk_stride_s = p.dk_stride_s,
                    dk_stride_h = p.dk_stride_h;
    const float softmax_scale = p.softmax_scale;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    static_assert(DQ_BULK == 0, "DQ_BULK needs sm_90 or newer (cp.reduce.async.bulk)");
#endif
    static_assert(!ORDERED || DQ_BULK > 0, "ordered additions are bulk reductions");
    constexpr int NTHREADS = Tile::NTHREADS, PITCH = Tile::PITCH;
    constexpr bool GROUP_K = Tile::GROUP_K;
    constexpr int S_MT = Tile::S_MT, S_NT = Tile::S_NT, KV_MT = Tile::KV_MT,
                  KV_NT = Tile::KV_NT, Q_MT = Tile::Q_MT, DQ_PASS = Tile::DQ_PASS;
    constexpr float LOG2E = 1.4426950408889634f;

    // ---- shared memory: one buffer carved into named tiles --------------------------------
    extern __shared__ __attribute__((aligned(128))) unsigned char smem[];
    // (rows, PITCH) tiles: HD columns used, the rest (if any) never read
    elem_t* sK = reinterpret_cast<elem_t*>(smem);                     // (B_c, HD)  K_j
    elem_t* sV = sK + B_c * PITCH;                                    // (B_c, HD)  V_j
    elem_t* sQ = sV + B_c * PITCH;                                    // QSTAGES x (B_r, HD) Q_i
    elem_t* sdO = sQ + QSTAGES * B_r * PITCH;                         // QSTAGES x (B_r, HD) dO_i
    elem_t* sP = sdO + QSTAGES * B_r * PITCH;                         // (B_r, B_c) P_ij
    elem_t* sdS = sP + B_r * B_c;                                     // (B_r, B_c) dS_ij
    float* sL = reinterpret_cast<float*>(sdS + B_r * B_c);            // QSTAGES x (B_r) L_i
    float* sD = sL + QSTAGES * B_r;                                   // QSTAGES x (B_r) D_i
    // then DQ_BULK x (B_r x HD) dQ_ij tiles, float32, at byte offset OFF_DQ

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // This warp's tile in each of the three products (row part, column part).
    const int s_m = warp % WM_SDP, s_n = warp / WM_SDP;     // S, dP: rows, keys
    const int kv_m = warp % WM_DKV, kv_n = warp / WM_DKV;   // dK, dV: keys, head dim
    const int q_m = warp % WM_DQ, q_n = warp / WM_DQ;       // dQ: rows, head dim
    // Grid (T_c or splits, heads, batch); ORDERED and non-causal: (heads, batch, T_c) (see
    // "Deterministic mode" above).
    constexpr bool by_head = ORDERED && !CAUSAL;
    const int grid_head = by_head ? blockIdx.x : blockIdx.y;  // (kv head, part), see above
    const int batch = by_head ? blockIdx.y : blockIdx.z, nbatch = by_head ? gridDim.y : gridDim.z;
    static_assert(!(SeqT::PACKED && ORDERED), "packed batches: no ordered mode");
    // This batch entry's lengths (seqinfo.cuh; packed: the entry's own, while p.seqlen_q, the
    // longest entry's, sizes the grid; dense: also the dQ workspaces, `ws_rows` below, which
    // packed batches keep compact, row_block_index and dst0).
    const SeqInfo seq = SeqT::info(p, batch);
    const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
    const int ws_rows = p.seqlen_q;  // query rows per (batch, head) in dQ_accum and dQ_order
    // The query head whose row blocks are being visited (the loop over heads below).
    int head = 0;
    // the score hook (score.cuh): the scale in the exponent (a hook that rewrites S is made
    // per query head where it is applied)
    const Score score(p, batch, 0);
    const int chunks = d / 8;
    const int T_c = (seqlen_k + B_c - 1) / B_c;

    // ldmatrix addressing (common.cuh: lane patterns and SwizzledReader). Six readers serve
    // the ten operands: tiles read the same way differ only by a compile-time byte offset.
    const unsigned sbase = smem_u32(smem);
    constexpr unsigned OFF_K = 0, OFF_V = Tile::TILE_KV, OFF_Q = 2 * Tile::TILE_KV;
    constexpr unsigned OFF_DO = OFF_Q + QSTAGES * Tile::TILE_Q;
    constexpr unsigned OFF_P = OFF_DO + QSTAGES * Tile::TILE_Q, OFF_DS = OFF_P + Tile::TILE_P;
    constexpr unsigned OFF_DQ = OFF_DS + Tile::TILE_P + 2 * QSTAGES * Tile::VEC;
    constexpr bool REBUILD = Tile::REBUILD, OPAQUE_ROWS = Tile::OPAQUE_ROWS;  // (see the Tile)
    auto rows_opaque = [&](int x) { return OPAQUE_ROWS ? opaque(x) : x; };
    auto lane_id = [&]() { return REBUILD ? opaque(lane) : lane; };
    // A from a row-major tile, or B (.trans) from a [k][n] tile
    auto rows_first = [&](auto cols, unsigned tile, int chunk_offset) {
        const int l = lane_id();
        return SwizzledReader<decltype(cols)::value>(tile, lane_row_rows_first(l),
                                                     lane_chunk_rows_first(l), chunk_offset);
    };
    // B from an [n][k] tile, or A (.trans) from a [k][m] tile
    auto chunks_first = [&](auto cols, unsigned tile, int chunk_offset) {
        const int l = lane_id();
        return SwizzledReader<decltype(cols)::value>(tile, lane_row_chunks_first(l),
                                                     lane_chunk_chunks_first(l), chunk_offset);
    };

    // Row block i: HBM -> shared buffer `buf` (cp.async; caller commits), the parts in `parts`:
    // ROW_QLD = Q_i, L_i, D_i; ROW_DO = dO_i. At HD > 128 the pointers are rebuilt from the
    // kernel arguments on every call (opaque copies of the indices): integer ops per row block
    // instead of ~10 registers held across the loop.
    constexpr int ROW_QLD = 1, ROW_DO = 2, ROW_ALL = ROW_QLD | ROW_DO;
    auto load_row_block = [&](int i, int buf, int parts) {
        constexpr bool OPQ = REBUILD || OPAQUE_ROWS;
        const int row0 = rows_opaque(i) * B_r, t = OPQ ? opaque(tid) : tid;
        const long long b = OPQ ? opaque(batch) : batch;
        const long long h = OPQ ? opaque(head) : head;
        if (parts & ROW_QLD)
            load_tile<Tile, B_r, PITCH, NTHREADS>(
                sQ + buf * B_r * PITCH,
                Q + SeqT::info(p, b).q_offset(q_stride_b, q_stride_s) + h * q_stride_h +
                    row0 * q_stride_s,
                q_stride_s, seqlen_q - row0, chunks, d, t);
        if (parts & ROW_DO)
            load_tile<Tile, B_r, PITCH, NTHREADS>(
                sdO + buf * B_r * PITCH,
                dO + SeqT::info(p, b).q_offset(do_stride_b, do_stride_s) + h * do_stride_h +
                    row0 * do_stride_s, do_stride_s,
                seqlen_q - row0, chunks, d, t);
        if ((parts & ROW_QLD) && t < B_r) {
            const bool valid = row0 + t < seqlen_q;
            const long long at = SeqT::info(p, b).row_vector(h, nheads) + (valid ? row0 + t : 0);
            cp_async_4(smem_u32(sL + buf * B_r + t), L + at, valid);
            cp_async_4(smem_u32(sD + buf * B_r + t), Dsum + at, valid);
        }
    };

    // DQ_BULK: hand the current dQ tile (complete: call after a barrier) to the copy engine, to
    // be added into row block i of dQ_accum (thread 0 issues it), and move on to the next tile.
    // ORDERED: await_turn(i, j) first waits for column block j's turn at row block i
    // (its rank), flush_dq stores rather than adds at rank 0, and release_dq(i, j) passes the
    // turn on once the operation has completed. Everything is recomputed from the block
    // indices and the arguments: thread 0 alone needs it. (When the ordered path was a run-time
    // flag in every kernel, opaque copies of batch and head made the d 64 causal kernel spill
    // 36 bytes, and the wait inside flush_dq, after the barrier, the fp16 d 128 causal one 8.)
    int dq_tile = 0;  // the tile this block's next dQ_ij goes to
    auto row_block_index = [&](int i) {  // (batch, head, row block i), flattened
        if constexpr (SeqT::PACKED)  // (compact: (head, the entry's first row block + i))
            return (long long)head * p.ws_blocks + p.row_block_offsets[batch] + i;
        else
            return ((long long)batch * nheads + head) * ((ws_rows + B_r - 1) / B_r) + i;
    };
    auto dq_rank = [&](int i, int j) {  // column block j's turn among those that see row block i
        return column_blocks<B_r, B_c>(MaskT(p, seqlen_q, seqlen_k), i).end - 1 - j;
    };
    auto await_turn = [&](int i, int j) {
        if (ORDERED && tid == 0)
            wait_counter(dQ_order + row_block_index(i), dq_rank(i, j));
    };
    auto flush_dq = [&](int i, int j) {
        if (DQ_BULK && tid == 0) {
            float* dst = dQ_accum + row_block_index(i) * (B_r * HD);
            const unsigned src = sbase + OFF_DQ + dq_tile * Tile::TILE_DQ;
            if (ORDERED && dq_rank(i, j) == 0)
                bulk_store(dst, src, Tile::TILE_DQ);
            else
                bulk_reduce_add_f32(dst, src, Tile::TILE_DQ);
        }
        dq_tile = DQ_BULK == 2 ? dq_tile ^ 1 : 0;
    };
    auto release_dq = [&](int i, int j) {
        if (ORDERED && tid == 0) {
            bulk_wait();  // the reduction into row block i has completed
            set_counter(dQ_order + row_block_index(i), dq_rank(i, j) + 1);
        }
    };

    // Column blocks j < T_c: j = x, or T_c - 1 - x (ORDERED), x the block's index along the
    // column blocks (blockIdx.x, or blockIdx.z on the by-head grid), one per block, unless
    // deterministic with atomics (gridDim.x = splits): rounds of gridDim.x column blocks, block
    // x taking the x-th of each round; with the causal mask, the x-th from the end of each odd
    // round instead (column blocks get cheaper to the right, so this evens out the splits'
    // work). Without the mask T_c is recomputed from the argument at each test rather than held
    // in a register (it was the one value spilled at d 192 and d 256; with the mask the
    // recomputation moved a spill elsewhere: register allocation, not a rule).
    auto next_column = [&](int j) {
        if (DQ_BULK) return T_c;  // one column block per thread block
        if (!CAUSAL) return j + (int)gridDim.x;
        const unsigned x = blockIdx.x, splits = gridDim.x, round = (unsigned)j / splits;
        // j + the distance to this block's place in the next round
        return j + (int)(round & 1 ? 2 * x + 1 : 2 * (splits - x) - 1);
    };
    // ORDERED: this block's place x among the column blocks of its (batch, head part) is not
    // its block index but a ticket taken at start: CUDA does not promise that blocks start in
    // index order, and a block waits only for the one with ticket x - 1 of its group, which
    // has started (it took its ticket) and so holds an SM and will finish. The counters, one
    // per (batch, head part), follow dQ_order's (batch, heads, T_r) turn counters, zeroed
    // with them.
    int x = by_head ? blockIdx.z : blockIdx.x;
    if constexpr (ORDERED) {
        __shared__ int s_ticket;
        if (tid == 0) {
            // (batch, head part) of this block, flattened: the grid's two other dimensions
            const int group_of_block = by_head ? blockIdx.y * gridDim.x + blockIdx.x
                                               : blockIdx.z * gridDim.y + blockIdx.y;
            int* tickets = dQ_order + (long long)nbatch * nheads * ((ws_rows + B_r - 1) / B_r);
            s_ticket = atomicAdd(tickets + group_of_block, 1);
        }
        __syncthreads();
        x = ld_shared_s32(smem_u32(&s_ticket));
    }
    for (int j = !ORDERED ? x : T_c - 1 - x;
         j < (CAUSAL ? T_c : (opaque(seqlen_k) + B_c - 1) / B_c); j = next_column(j)) {
        const int col0 = j * B_c;  // first key of K_j
        // The row blocks that see column block j (OPAQUE_ROWS tiles recompute the range where
        // it is used rather than hold it in two registers).
        const RowBlocks rb_j = row_blocks<B_r, B_c>(MaskT(p, seqlen_q, seqlen_k), j);
        auto rb = [&] {
            return OPAQUE_ROWS ? row_blocks<B_r, B_c>(MaskT(p, opaque(seqlen_q), opaque(seqlen_k)),
                                                      opaque(j))
                               : rb_j;
        };

        float dk[KV_MT][KV_NT][4], dv[KV_MT][KV_NT][4];  // dK_j, dV_j: this warp's tile
#pragma unroll
        for (int mt = 0; mt < KV_MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < KV_NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) dk[mt][nt][e] = dv[mt][nt][e] = 0.f;

        __syncthreads();  // the previous column block is done with every buffer
        head = opaque(grid_head) / head_parts * group +
               opaque(grid_head) % head_parts * (group / head_parts);  // the part's first
        if (rb().begin < rb().end) {
            // K_j, V_j and the first row block in one cp.async group.
            const long long b = opaque(batch), hk = opaque(grid_head) / head_parts;
            load_tile<Tile, B_c, PITCH, NTHREADS>(
                sK, K + SeqT::info(p, b).k_offset(k_stride_b, k_stride_s) + hk * k_stride_h +
                        col0 * k_stride_s, k_stride_s,
                seqlen_k - col0, chunks, d, opaque(tid));
            load_tile<Tile, B_c, PITCH, NTHREADS>(
                sV, V + SeqT::info(p, b).k_offset(v_stride_b, v_stride_s) + hk * v_stride_h +
                        col0 * v_stride_s, v_stride_s,
                seqlen_k - col0, chunks, d, opaque(tid));
            load_row_block(rb().begin, 0, ROW_ALL);
            cp_async_commit();
        }

        // ---- the FA2 backward inner loop: one step per row block i ------------------------
        auto step = [&](int i, int buf, auto masked) {
            constexpr bool MASK = decltype(masked)::value;
            const int row0 = i * B_r;
            const unsigned qoff = buf * B_r * PITCH * 2;  // byte offset of buffer `buf`

            // This warp's (S_MW x S_NW) tile of S_ij, P_ij, dP_ij and dS_ij. MMA operands:
            // A = this warp's query rows of Q_i / dO_i, B = this warp's keys of K_j / V_j.
            const auto rd_s_a = rows_first(Int<PITCH>{}, sbase + s_m * Tile::S_MW * PITCH * 2, 0);
            const auto rd_s_b = chunks_first(Int<PITCH>{}, sbase + s_n * Tile::S_NW * PITCH * 2, 0);
            // acc += A B^T over the head dim, for A at byte offset off_a and B at off_b.
            // k step kk + 4 g = head-dim chunks 2 kk + 8 g. fence: a warp barrier between k
            // steps (Tile::DP_FENCE).
            auto product = [&](float (&acc)[S_MT][S_NT][4], unsigned off_a, unsigned off_b,
                               bool fence) {
                zero(acc);
                warp_mma<T, HD / 16, Tile::GROUP_HD>(
                    acc,
                    [&](unsigned (&a)[4], int mt, int kk, int g) {
                        if (fence && kk > 0 && mt == 0) __syncwarp();
                        ldmatrix_x4(a, rd_s_a.at(mt * 16, 2 * kk) + off_a + g * 128);
                    },
                    [&](unsigned (&b)[4], int nt2, int kk, int g) {
                        ldmatrix_x4(b, rd_s_b.at(nt2 * 16, 2 * kk) + off_b + g * 128);
                    });
            };
            // The rows a lane holds are all = lane / 4 (mod 8), so in the [query row][key]
            // tiles of P and dS the swizzled chunk depends on nt alone and the row offset is a
            // compile-time constant.
            const int l8 = lane_id() / 4, r_lane = s_m * Tile::S_MW + l8;
            const int st_base = r_lane * B_c + (lane_id() % 4) * 2;
            auto st_offset = [&](int mt, int e2, int nt) {
                return st_base + (mt * 16 + e2 * 8) * B_c +
                       (((s_n * Tile::S_NW / 8 + nt) ^ l8) * 8);
            };

            // S_ij = Q_i K_j^T, then P_ij = exp(scale S_ij - L_i) (0 where masked), stored to
            // shared memory in the input dtype for dV, and kept in registers, packed, for dS
            // (instead of being read back from shared memory: measured +4-9% at HD 64 and 128,
            // +2-3% above; the extra reads had filled the shared-memory instruction queue, ncu
            // "MIO throttle"). dS uses the rounded P, as 16-bit autodiff would. With the score
            // hook, S_ij is hooked first and the registers keep P_ij times the hook's
            // derivative (the softcap's 1 - tanh^2), which is all dS needs of it.
            unsigned pk[S_MT][2][S_NT];  // P_ij (times the hook's derivative)
            {
                const Score hook(p, batch, head);  // (this query head)
                float acc[S_MT][S_NT][4];
                product(acc, OFF_Q + qoff, OFF_K, false);
#pragma unroll
                for (int mt = 0; mt < S_MT; ++mt)
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2) {
                    const int r = r_lane + mt * 16 + e2 * 8;  // row within the block
                    const float l2 = sL[buf * B_r + r] * LOG2E;
                    // the keys row r sees (mask.cuh), counted from this lane's first column
                    const int lane_col = col0 + s_n * Tile::S_NW + (lane_id() % 4) * 2;
                    // (lo and hi spelled out, not keys.lo - lane_col: that form changed the
                    // schedule of the d 64 and d 96 loops, PERFORMANCE.md)
                    const KeyRange keys = MaskT(p, seqlen_q, seqlen_k).keys(row0 + r);
                    const int lo = keys.lo - col0 - s_n * Tile::S_NW - (lane_id() % 4) * 2;
                    const int hi = keys.hi - col0 - s_n * Tile::S_NW - (lane_id() % 4) * 2;
                    const float dist = hook.template diagonal<shifted_diagonal<SeqT, MaskT>()>(
                        p, row0 + r, lane_col, SeqT::PACKED ? seqlen_q : p.seqlen_q,
                        SeqT::PACKED ? seqlen_k : p.seqlen_k);  // (dense: the params')
#pragma unroll
                    for (int nt = 0; nt < S_NT; ++nt) {
                        // P_ij at columns lane_col + nt * 8 + e1, and the hook's derivative
                        float pe[2], df[2] = {1.f, 1.f};
#pragma unroll
                        for (int e1 = 0; e1 < 2; ++e1) {
                            float s = acc[mt][nt][e2 * 2 + e1];
                            if constexpr (Score::REWRITES)  // the score hook (score.cuh)
                                s = hook.apply(p, s, dist - static_cast<float>(nt * 8 + e1),
                                               df[e1]);
                            pe[e1] = exp2_approx(fmaf(s, score.exp2_scale, -l2));
                            if (MASK && MaskT::hidden(nt * 8 + e1, lo, hi)) pe[e1] = 0.f;
                        }
                        const unsigned packed = T::pack(pe[0], pe[1]);
                        pk[mt][e2][nt] = Score::REWRITES ? T::pack(pe[0] * df[0], pe[1] * df[1])
                                                         : packed;
                        *reinterpret_cast<unsigned*>(sP + st_offset(mt, e2, nt)) = packed;
                    }
                }
            }
            // dP_ij = dO_i V_j^T, then dS_ij = P_ij ∘ (dP_ij - D_i), stored to shared memory.
            {
                float acc[S_MT][S_NT][4];
                product(acc, OFF_DO + qoff, OFF_V, Tile::DP_FENCE);
#pragma unroll
                for (int mt = 0; mt < S_MT; ++mt)
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2) {
                    const float D_r = sD[buf * B_r + r_lane + mt * 16 + e2 * 8];
#pragma unroll
                    for (int nt = 0; nt < S_NT; ++nt) {
                        float pe[2];
                        T::unpack(pk[mt][e2][nt], pe[0], pe[1]);
                        const float ds0 = pe[0] * (acc[mt][nt][e2 * 2] - D_r);
                        const float ds1 = pe[1] * (acc[mt][nt][e2 * 2 + 1] - D_r);
                        *reinterpret_cast<unsigned*>(sdS + st_offset(mt, e2, nt)) =
                            T::pack(ds0, ds1);
                    }
                }
            }
            // dQ tile dq_tile is free for this step's dQ_ij once the reduction issued from it
            // DQ_BULK steps ago has read it (later ones may still be pending). ORDERED:
            // the one issued at the top of this step has completed (about half a step ago)
            // and the next column block may add into row block i - 1.
            if constexpr (ORDERED) {
                if (i > rb().begin) release_dq(i - 1, j);
            } else if constexpr (DQ_BULK > 0) {
                if (tid == 0) bulk_wait_read<DQ_BULK - 1>();
            }
            __syncthreads();  // P_ij and dS_ij are complete

            // dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i, this warp's (KV_MW x KV_NW) tile;
            // k = the B_r query rows. A (.trans): this warp's keys are chunks of P / dS;
            // B (.trans): this warp's head-dim part of dO_i / Q_i. One product after the
            // other, so that only one product's fragments are live beside dK_j and dV_j.
            {
                const auto rd_kv_a = chunks_first(Int<B_c>{}, sbase, kv_m * Tile::KV_MW / 8);
                const auto rd_kv_b = rows_first(Int<PITCH>{}, sbase, kv_n * Tile::KV_NW / 8);
                // acc += A^T B, for A at byte offset off_a and B at off_b; k step kk + 4 g =
                // query rows 16 kk + 64 g.
                auto product_t = [&](float (&acc)[KV_MT][KV_NT][4], unsigned off_a,
                                     unsigned off_b) {
                    warp_mma<T, B_r / 16, GROUP_K>(
                        acc,
                        [&](unsigned (&a)[4], int mt, int kk, int g) {
                            ldmatrix_x4_trans(a, rd_kv_a.at(kk * 16, 2 * mt) + off_a +
                                                     g * 64 * B_c * 2);
                        },
                        [&](unsigned (&b)[4], int nd2, int kk, int g) {
                            ldmatrix_x4_trans(b, rd_kv_b.at(kk * 16, nd2 * 2) + off_b +
                                                     g * 64 * PITCH * 2);
                        });
                };
                product_t(dv, OFF_P, OFF_DO + qoff);
                // QSTAGES = 2: dO_{i+1} into the other buffer (read last in step i - 1), issued
                // here rather than with Q_{i+1} at the top of the step: the copies are spread
                // over the step (measured +4-7% at d 64-128, +10% at d 96; PERFORMANCE.md).
                if (QSTAGES == 2 && i + 1 < rb().end) {
                    load_row_block(i + 1, buf ^ 1, ROW_DO);
                    cp_async_commit();
                }
                product_t(dk, OFF_DS, OFF_Q + qoff);
                // QSTAGES = 1: the one row-block buffer is free once every warp is done with
                // its dK product, so row block i + 1 loads during the dQ product (rather than
                // after the step, overlapping nothing: measured +2-10% at d 160-192).
                if (QSTAGES == 1 && i + 1 < rb().end) {
                    __syncthreads();
                    load_row_block(i + 1, 0, ROW_ALL);
                    cp_async_commit();
                }
            }

            // dQ_i += dS_ij K_j, this warp's (Q_MW x Q_NW) tile; k = the B_c keys, one pass of
            // DQ_PASS n8 tiles at a time. Added to dQ_accum with float atomics, or (DQ_BULK)
            // stored to a dQ tile for one bulk reduction of the whole tile.
            // A: this warp's query rows of dS; B (.trans): this warp's head-dim part of K_j.
            const auto rd_q_a = rows_first(Int<B_c>{}, sbase + q_m * Tile::Q_MW * B_c * 2, 0);
            const auto rd_q_b = rows_first(Int<PITCH>{}, sbase, q_n * Tile::Q_NW / 8);
            // atomics: this warp's first dQ column, in slice `split` of dQ_accum
            const long long split = !DQ_BULK && deterministic ? opaque(blockIdx.x) : 0;
            // (packed: the compact workspace, (heads, total_q, HD), the entry's rows)
            float* dst0 = dQ_accum + q_n * Tile::Q_NW +
                (SeqT::PACKED
                     ? ((long long)opaque(head) * p.total_q + seq.start_q) * HD
                     : ((split * nbatch + opaque(batch)) * nheads + opaque(head)) * ws_rows * HD);
#pragma unroll
            for (int pass = 0; pass < Tile::DQ_PASSES; ++pass) {
                float dq[Q_MT][DQ_PASS][4];
                zero(dq);
                warp_mma<T, B_c / 16, GROUP_K>(  // k step kk + 4 g = keys 16 kk + 64 g
                    dq,
                    [&](unsigned (&a)[4], int mt, int kk, int g) {
                        ldmatrix_x4(a, rd_q_a.at(mt * 16, 2 * kk) + OFF_DS + g * 128);
                    },
                    [&](unsigned (&b)[4], int nd2, int kk, int g) {
                        ldmatrix_x4_trans(b, rd_q_b.at(kk * 16, pass * DQ_PASS + nd2 * 2) +
                                                 OFF_K + g * 64 * PITCH * 2);
                    });
                if constexpr (DQ_BULK > 0) {
                    const unsigned dst = sbase + OFF_DQ + dq_tile * Tile::TILE_DQ +
                        Tile::dq_fragment(warp, 0, 0, 0, lane_id()) * 4;
#pragma unroll
                    for (int mt = 0; mt < Q_MT; ++mt)
#pragma unroll
                        for (int nt = 0; nt < DQ_PASS; ++nt)
                            st_shared_v4(dst + Tile::dq_fragment(0, pass, mt, nt, 0) * 4,
                                         dq[mt][nt][0], dq[mt][nt][1], dq[mt][nt][2],
                                         dq[mt][nt][3]);
                } else {
                    // Float atomics into dQ_accum (row pitch HD: offsets are compile-time);
                    // rows past seqlen_q skipped (they occur only in the masked variant, which
                    // the last, partial row block always takes). Columns past d receive dS
                    // times the zero padding of K_j, and are never read back.
                    const int ln = lane_id();
                    const int row_g = row0 + q_m * Tile::Q_MW + ln / 4;  // row g of mt = 0
#if __CUDA_ARCH__ >= 900
                    // 4 consecutive columns per instruction: lanes 2t and 2t+1 swap halves so
                    // that the even lane holds row g and the odd lane row g + 8 of columns
                    // 4 (t / 2) .. 4 (t / 2) + 3.
                    const bool odd = ln & 1;
                    const int my_row = row_g + (odd ? 8 : 0);
                    float* dst = dst0 + (long long)my_row * HD + ((ln % 4) & ~1) * 2;
#else
                    float* dst = dst0 + (long long)row_g * HD + (ln % 4) * 2;
#endif
#pragma unroll
                    for (int mt = 0; mt < Q_MT; ++mt) {
#pragma unroll
                        for (int nt = 0; nt < DQ_PASS; ++nt) {
                            float* p = dst + mt * 16 * HD + (pass * DQ_PASS + nt) * 8;
                            const float* c = dq[mt][nt];
#if __CUDA_ARCH__ >= 900
                            const float r0 = shfl_xor(odd ? c[0] : c[2], 1);
                            const float r1 = shfl_xor(odd ? c[1] : c[3], 1);
                            red_add_f32x4(!MASK || my_row + mt * 16 < seqlen_q, p,
                                          odd ? r0 : c[0], odd ? r1 : c[1], odd ? c[2] : r0,
                                          odd ? c[3] : r1);
#else
#pragma unroll
                            for (int e2 = 0; e2 < 2; ++e2)
#pragma unroll
                                for (int e1 = 0; e1 < 2; ++e1)
                                    red_add_f32(!MASK || row_g + mt * 16 + e2 * 8 < seqlen_q,
                                                p + e2 * 8 * HD + e1, c[e2 * 2 + e1]);
#endif
                        }
                    }
                }
            }
            if (DQ_BULK) fence_proxy_async_shared();  // the dQ tile: visible to the copy engine
        };

        // The query heads of this block's part in turn (one without GQA): for each, every row
        // block that sees column block j. K_j, V_j stay in shared memory, dK_j and dV_j keep
        // accumulating. (Of the loop forms tried, this one left every tile spill-free.)
        for (const int head_end = head + group / head_parts; head < head_end; ++head) {
            if (head + group / head_parts != head_end && rb().begin < rb().end) {  // not the 1st
                __syncthreads();  // every warp is done with the previous head's last row block
                load_row_block(rb().begin, 0, ROW_ALL);
                cp_async_commit();
            }
            for (int i = rb().begin; i < rb().end; ++i) {
                const int buf = QSTAGES == 2 ? (i - rows_opaque(rb().begin)) & 1 : 0;
                if (i > rb().begin) await_turn(i - 1, j);  // (ORDERED)
                cp_async_wait<0>();
                // Row block i (and K_j, V_j) are in shared memory, and every warp is done with
                // step i - 1: its row-block buffer, P and dS may be overwritten, its dQ tile sent.
                __syncthreads();
                if (DQ_BULK && i > rb().begin) {  // step i - 1's dQ tile is complete
                    flush_dq(i - 1, j);
                }
                if (QSTAGES == 2 && i + 1 < rb().end) {  // Q_{i+1}, L, D load during this step
                    load_row_block(i + 1, buf ^ 1, ROW_QLD);
                    cp_async_commit();
                }
                // (sliding windows: every block through the masked step, one copy of its
                // code, as in the forward)
                if (MaskT::LOCAL ||
                    block_needs_mask<B_r, B_c>(
                        MaskT(p, rows_opaque(seqlen_q), rows_opaque(seqlen_k)), i, j) ||
                    (i + 1) * B_r > seqlen_q)
                    step(i, buf, Bool<true>{});
                else
                    step(i, buf, Bool<false>{});
            }

            if (DQ_BULK && rb().begin < rb().end) {
                await_turn(rb().end - 1, j);
                __syncthreads();  // the last row block's dQ tile is complete
                flush_dq(rb().end - 1, j);
                release_dq(rb().end - 1, j);
            }
        }  // query heads

        // ---- epilogue: dK_j = scale * dK_j, dV_j, written straight from registers ----------
        // summed over the part's query heads, to kv head grid_head / head_parts: in the input
        // dtype, or (head_parts > 1) into float32 slice grid_head % head_parts.
        const long long out_head = opaque(grid_head) / head_parts;
        const int l_e = opaque(lane), w_e = opaque(warp);
        const int kv_m_e = w_e % WM_DKV, kv_n_e = w_e / WM_DKV;
#pragma unroll
        for (int mt = 0; mt < KV_MT; ++mt)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
            const int key = col0 + kv_m_e * Tile::KV_MW + mt * 16 + l_e / 4 + e2 * 8;
            if (key >= seqlen_k) continue;
            const long long base = SeqT::info(p, opaque(batch)).k_offset(dk_stride_b, dk_stride_s) +
                                   key * dk_stride_s +
                                   out_head * dk_stride_h + kv_n_e * Tile::KV_NW + (l_e % 4) * 2;
#pragma unroll
            for (int nt = 0; nt < KV_NT; ++nt) {
                if (kv_n_e * Tile::KV_NW + nt * 8 >= d) break;
                const float k0 = dk[mt][nt][e2 * 2] * softmax_scale;
                const float k1 = dk[mt][nt][e2 * 2 + 1] * softmax_scale;
                const float v0 = dv[mt][nt][e2 * 2], v1 = dv[mt][nt][e2 * 2 + 1];
                if (head_parts > 1) {
                    const long long slice =
                        (long long)(opaque(grid_head) % head_parts) * nbatch * dk_stride_b;
                    float* fk = static_cast<float*>(dK) + slice + base + nt * 8;
                    float* fv = static_cast<float*>(dV) + slice + base + nt * 8;
                    // (OddD: the pair's columns may be past d, in the next row)
                    const int col = kv_n_e * Tile::KV_NW + nt * 8 + (l_e % 4) * 2;
                    if (!Tile::ODD_D || col < d) {
                        fk[0] = k0;
                        fv[0] = v0;
                    }
                    if (!Tile::ODD_D || col + 1 < d) {
                        fk[1] = k1;
                        fv[1] = v1;
                    }
                } else if constexpr (Tile::ODD_D) {  // (2-byte aligned: element by element)
                    const int col = kv_n_e * Tile::KV_NW + nt * 8 + (l_e % 4) * 2;
                    store_pair_elementwise(static_cast<elem_t*>(dK) + base + nt * 8, col, d,
                                           T::pack(k0, k1));
                    store_pair_elementwise(static_cast<elem_t*>(dV) + base + nt * 8, col, d,
                                           T::pack(v0, v1));
                } else {
                    *reinterpret_cast<unsigned*>(static_cast<elem_t*>(dK) + base + nt * 8) =
                        T::pack(k0, k1);
                    *reinterpret_cast<unsigned*>(static_cast<elem_t*>(dV) + base + nt * 8) =
                        T::pack(v0, v1);
                }
            }
        }
    }
    if (DQ_BULK && tid == 0) bulk_wait();  // the last reduction has read its source
}

}  // namespace cuflash
