// fa2_backward_sm90.cu: FlashAttention-2 backward on Hopper (sm_90a): TMA loads, wgmma, warp
// specialisation. The algorithm of fa2_backward.cu (the seed document, section 2.4.1.2):
//   one thread block per (column block j of K/V, kv head, batch); K_j and V_j stay in shared
//   memory and dK_j, dV_j in registers while the block walks the row blocks i of Q that see
//   column block j (and, with GQA, every query head of the kv head's group):
//       S_ij  = Q_i K_j^T                       recomputed, never stored in HBM
//       P_ij  = exp(scale * S_ij - L_i)         from the forward's log-sum-exp L
//       dV_j += P_ij^T dO_i
//       dP_ij = dO_i V_j^T
//       dS_ij = P_ij ∘ (dP_ij - D_i)            D = rowsum(dO ∘ O), backward_passes.cuh
//       dK_j += dS_ij^T Q_i                     (times scale at the end)
//       dQ_i += dS_ij K_j                       (float32 additions into dQ_accum; times scale
//                                                in fa2_backward_dq_bulk)
// The step is under "one step: row block i" below.
//
// Transposed products. wgmma's M is 64 rows of a warpgroup, and dK_j, dV_j are what stays in
// registers, so each consumer warpgroup owns 64 of the B_c keys and computes the step's
// matrices transposed, keys as rows: S^T = K_j Q_i^T and dP^T = V_j dO_i^T (both operands in
// shared memory, K-major as TMA stores them), then P^T and dS^T in the accumulators' layout,
// which is the A-fragment layout of the next two products: dV_j += P^T dO_i and
// dK_j += dS^T Q_i take P^T and dS^T from registers (dO_i and Q_i N-major, as V in the
// forward's P~V). L_i and D_i now vary along the columns.
// dQ_i = dS K_j needs the queries as rows and all B_c keys: each consumer stores its dS^T
// (64 keys x B_r queries) to shared memory, and wgmma reads dS from there transposed (M-major;
// Wgmma::ss_mn), with K_j N-major. Its 64-column groups of the head dim go to the consumers in
// turn ((step + group) % 2), so each does at most one group per step (d 128: one each; d 64:
// every other step). The group's float32 tile is added into dQ_accum in fragment order
// (fa2_backward_dq_bulk undoes it): by 16-byte reductions straight from the registers, or
// through shared memory by one bulk reduction (cp.reduce.async.bulk .add.f32) that runs while
// the next step computes, issued by the producer thread, per kernel as measured (DQ_RED
// below; the ordered mode: bulk).
//
// Work split (warpgroups of 128 threads):
//   warpgroup 0, the producer: thread 0 issues the loads (K_j and V_j once, then Q_i, dO_i
//     by TMA and L_i log2(e), D_i by bulk copies, from the preprocess's padded rows, for each
//     step into a ring of STAGES slots) and, on the bulk path, adds each step's dQ tiles from
//     shared memory into dQ_accum once the step has freed its slot (ORDERED: in turn); the
//     warpgroup gives its registers to the consumers;
//   warpgroups 1, 2, the consumers: 64 keys each, the five products above.
// Each slot has two mbarriers: full (the copies' bytes) and free (one arrival per consumer
// warp once its last product of the step has read the slot).
//
// Shared-memory layout: tiles as TMA writes them with the 128-byte swizzle, in column groups
// of 64 head-dim elements (hopper.cuh, smem_desc): K_j, V_j: [HD / 64][B_c][64]; Q_i, dO_i:
// [HD / 64][B_r][64]; dS^T: [64 keys][B_r = 64 queries] per consumer, written by the threads
// in the same swizzle.
//
// Variants (template parameters; cuflash/_plan.py picks them): T (fp16 | bf16), Tile =
// BackwardTileSm90<HD, STAGES> (HD the head dim padded to 64 or 128), MaskT = Mask<CAUSAL,
// LOCAL> (LOCAL: a sliding window's lower limit; ring attention's shifted blocks come as
// windows too), ORDERED (the deterministic mode: dQ's additions in a fixed order), ScoreT
// (ScoreScale | ScoreHook, score.cuh: softcap and ALiBi), SeqT (DenseSeq | PackedSeq,
// seqinfo.cuh: variable-length batches, not ORDERED). d > 128, and the score hook over a
// variable-length batch above d 64, run on the portable backward (cuflash/_plan.py,
// sm90_backward_buckets).
#include "common.cuh"
#include "hopper.cuh"
#include "params.cuh"
#include "seqinfo.cuh"
#include "mask.cuh"
#include "block_range.cuh"
#include "score.cuh"
#include "backward_passes.cuh"

namespace cuflash {

// A dQ tile's destination, handed by its consumer to the producer thread (fa2_backward_sm90):
// dQ_accum's address of the group, the row block's turn counter (an index into dq_order) and
// the rank (ORDERED: the tile's place in the row block's order; else 1).
struct DqMail {
    float* dst;
    int row_block;
    int rank;
};

template <int HD_, int STAGES_ = 2>
struct BackwardTileSm90 {
    static constexpr int CONSUMERS = 2;  // consumer warpgroups, 64 keys each
    static constexpr int HD = HD_, B_r = 64, B_c = 64 * CONSUMERS, STAGES = STAGES_;
    static constexpr int NTHREADS = 128 * (1 + CONSUMERS);
    static constexpr int GROUPS = HD / 64;  // 64-column groups of the head dim
    static constexpr int NT_S = B_r / 8;    // n8 tiles across S^T, dP^T (64 keys x B_r queries)
    static constexpr int NT_D = HD / 8;     // n8 tiles across dK_j, dV_j (64 keys x HD)
    // Shared memory (bytes), each tile on a 1024-byte boundary: K_j, V_j; STAGES x (Q_i,
    // dO_i); two buffers of both consumers' dS^T (step i writes buffer i % 2: the other
    // consumer may still read the last step's); one float32 dQ group tile per consumer (the
    // bulk path's; unused where DQ_RED); then STAGES x (L_i, D_i) and the mbarriers and the
    // ordered mode's ticket; 1024 more for the alignment.
    static constexpr int KV_BYTES = B_c * HD * 2;   // one of K_j, V_j
    static constexpr int ROW_BYTES = B_r * HD * 2;  // one of Q_i, dO_i
    static constexpr int DS_BYTES = 64 * B_r * 2;   // one consumer's dS^T
    static constexpr int DQ_BYTES = B_r * 64 * 4;   // one 64-column group of dQ_ij, float32
    static constexpr int VEC_BYTES = B_r * 4;       // one of L_i, D_i
    // the mbarriers (K_j V_j full, STAGES x full, STAGES x free), the deterministic mode's
    // ticket, the dQ tiles' mbarriers (CONSUMERS x full, CONSUMERS x empty: the bulk path) and
    // mailboxes (DqMail)
    // in the carved layout, not a static __shared__ variable, which would come 1024-aligned on
    // top of SMEM_BYTES and push the d 128 3-slot tile past 227 KB.
    static constexpr int BAR_BYTES = 8 * (2 + 2 * STAGES + 2 * CONSUMERS) + 16 * CONSUMERS;
    static constexpr int SMEM_BYTES = 1024 + 2 * KV_BYTES + 2 * STAGES * ROW_BYTES +
                                      2 * CONSUMERS * DS_BYTES + CONSUMERS * DQ_BYTES +
                                      2 * STAGES * VEC_BYTES + BAR_BYTES;
    // setmaxnreg (hopper.cuh): 384 threads launch with 168 registers each; the producer gives
    // all but 24 to the consumers (2 x 240 + 24 = 504 per thread of a warpgroup). At 232 the
    // d 128 consumers spilled and ptxas serialized their wgmma (C7512); at 24 the producer
    // holds one loop (a copy loop of L and D beside it spilled).
    static constexpr int CONSUMER_REGS = 240, PRODUCER_REGS = 24;
    static_assert(PRODUCER_REGS * 128 + CONSUMERS * CONSUMER_REGS * 128 <=
                      65536 / NTHREADS / 8 * 8 * NTHREADS,
                  "setmaxnreg: the warpgroups ask for more registers than the launch has");
    // dQ_accum's fragment order, in the names of the portable tile that fa2_backward_dq_bulk
    // reads (BackwardTile::dq_fragment): a row block's tile is GROUPS x 4 "warps" (64-column
    // group g, warp w of the consumer that computed it: 16 rows) of 8 n8 tiles x 32 lanes x 4
    // floats, so that each group's 16 KB is one contiguous bulk reduction.
    static constexpr int WM_DQ = 4, Q_MW = 16, Q_MT = 1, Q_NW = 64, DQ_PASS = 8, DQ_PASSES = 1;
    static constexpr bool ODD_D = false;  // (TMA: d is a multiple of 8)
    // n8 tiles per thread of the dQ pass (fa2_backward_dq_bulk): four, one 16-byte store per
    // row and lane (dQ is C-contiguous on a 16-byte boundary, cuflash/_api.py)
    static constexpr int DQ_VEC = 4;

    static_assert(HD == 64 || HD == 128, "head dim padded to 64 or 128 (larger: portable)");
    static_assert(STAGES >= 2, "at least two Q_i / dO_i slots");
};

template <typename T, typename Tile, typename MaskT, bool ORDERED = false,
          typename ScoreT = ScoreScale, typename SeqT = DenseSeq>
__global__ void __launch_bounds__(Tile::NTHREADS, 1)
fa2_backward_sm90(const __grid_constant__ Sm90BwdParams p) {
    constexpr int HD = Tile::HD, B_r = Tile::B_r, B_c = Tile::B_c, STAGES = Tile::STAGES;
    constexpr int GROUPS = Tile::GROUPS, NT_S = Tile::NT_S, NT_D = Tile::NT_D;
    constexpr int CONSUMERS = Tile::CONSUMERS;

    // ---- shared memory, carved from a 1024-byte aligned base ---------------------------------
    extern __shared__ __attribute__((aligned(1024))) unsigned char smem_raw[];
    const unsigned raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
    auto generic = [&](unsigned addr) { return smem_raw + (addr - raw); };  // (C++ pointer)
    const unsigned sK = base, sV = sK + Tile::KV_BYTES, sRows = sV + Tile::KV_BYTES;
    auto sQ = [&](int stage) { return sRows + stage * Tile::ROW_BYTES; };
    auto sdO = [&](int stage) { return sRows + (STAGES + stage) * Tile::ROW_BYTES; };
    const unsigned sdS0 = sRows + 2 * STAGES * Tile::ROW_BYTES;
    auto sdS = [&](int buf, int c) { return sdS0 + (buf * CONSUMERS + c) * Tile::DS_BYTES; };
    const unsigned sdQ0 = sdS0 + 2 * CONSUMERS * Tile::DS_BYTES;
    auto sdQ = [&](int c) { return sdQ0 + c * Tile::DQ_BYTES; };
    const unsigned sVec = sdQ0 + CONSUMERS * Tile::DQ_BYTES;
    auto sL = [&](int stage) { return sVec + 2 * stage * Tile::VEC_BYTES; };  // L_i log2 e
    auto sD = [&](int stage) { return sL(stage) + Tile::VEC_BYTES; };
    const unsigned bars = sVec + 2 * STAGES * Tile::VEC_BYTES;
    const unsigned kv_full = bars;
    auto full = [&](int stage) { return bars + 8 * (1 + stage); };
    auto free_slot = [&](int stage) { return bars + 8 * (1 + STAGES + stage); };
    const unsigned sTicket = bars + 8 * (1 + 2 * STAGES);  // (ORDERED)
    auto dq_full = [&](int c) { return bars + 8 * (2 + 2 * STAGES + c); };  // (!DQ_RED)
    auto dq_empty = [&](int c) { return bars + 8 * (2 + 2 * STAGES + CONSUMERS + c); };
    auto sMail = [&](int c) { return bars + 8 * (2 + 2 * STAGES + 2 * CONSUMERS) + 16 * c; };

    static_assert(!(SeqT::PACKED && ORDERED), "packed batches: no ordered mode");
    const int tid = threadIdx.x, warpgroup = tid / 128;
    const int nheads = p.nheads;
    // (dense: dQ_accum's row blocks per (batch, head); packed: unused, see row_block_index)
    const int T_r = (p.seqlen_q + B_r - 1) / B_r;
    // The block's column block j, kv head and batch entry; one block per column block.
    // Grid (T_c, kv heads, batch), blocks started in index order as SMs free up, column
    // blocks fastest, so that the blocks that run at once share their head's Q_i and dO_i in
    // L2. BY_COLUMN (the causal mask alone, dense, not ORDERED): grid (kv heads, T_c, batch),
    // each batch entry's tiles column block by column block. Causal column block j sees
    // about T_r - j B_c / B_r row blocks, so each entry hands its longest tiles out first and
    // its shortest last, and the blocks' last round ends level (with j fastest, the last
    // pair's longest tile started near the end: cuflash/_registry.py, sm90_backward_grid).
    // Read from blockIdx, not computed: held through the step loop, computed indices spilled
    // the d 128 causal consumers 8-12 bytes.
    // SPLIT (dense, no mask, no window, not ORDERED): a 1-d grid over the T_c x kv heads x
    // batch tiles, j fastest; the tiles from p.tail_whole on come as p.tail_parts blocks
    // each, part `part` taking its share of the tile's steps (the split tail, below).
    // ORDERED (the deterministic mode, as fa2_backward.cu's): the
    // additions into each row block of dQ_accum go in a fixed order, column blocks right to
    // left (rank n_i - 1 - j, n_i = column_blocks(i).end; rank 0 stores), each waiting for the
    // turn counter of its (batch, head, row block) in p.dq_order to reach its rank (times the
    // dQ groups per step: each group's reduction counts once it has completed). A block takes
    // j = T_c - 1 - x for a ticket x drawn from its (batch, kv head)'s counter when it starts,
    // so that it waits only on blocks that started before it (CUDA promises no start order).
    // Grid (T_c, kv heads, batch); without the causal mask (H, T_c, batch x kv heads / H): the
    // (batch, kv head) pairs f = blockIdx.z H + blockIdx.x in groups of H, a group's blocks
    // started column rank by column rank, so that about SMs / H blocks of each pair run at
    // once. Those share Q_i, dO_i and dQ_accum's row blocks in L2 but trail each other by a
    // turn, as all start at row block 0; the host picks H (_registry.ordered_wave_heads).
    // H = all pairs: every pair's block x starts before any block x + 1 (no trailing, but
    // nothing shared in L2: ncu, session 15).
    constexpr bool BY_HEAD = ORDERED && !MaskT::CAUSAL;
    constexpr bool SPLIT = !ORDERED && !SeqT::PACKED && !MaskT::CAUSAL && !MaskT::LOCAL;
    constexpr bool BY_COLUMN = !ORDERED && !SeqT::PACKED && MaskT::CAUSAL && !MaskT::LOCAL;
    const int kv_heads = nheads / p.group, f = blockIdx.z * gridDim.x + blockIdx.x;
    const int T_c = (p.seqlen_k + B_c - 1) / B_c;
    // (a function of blockIdx, called again after the step loop: kept through it, the values
    // made the d 128 hooked consumers spill)
    auto split_block = [&]() {
        struct {
            int tile, part, parts;
        } b{(int)blockIdx.x, 0, 1};
        if (SPLIT && b.tile >= p.tail_whole) {
            b.parts = p.tail_parts;
            b.part = (b.tile - p.tail_whole) % b.parts;
            b.tile = p.tail_whole + (b.tile - p.tail_whole) / b.parts;
        }
        return b;
    };
    const auto [tile, part, parts] = split_block();
    const int head_k = SPLIT       ? tile / T_c % kv_heads
                       : BY_HEAD   ? f % kv_heads
                       : BY_COLUMN ? blockIdx.x
                                   : blockIdx.y;
    const int batch = SPLIT ? tile / T_c / kv_heads : BY_HEAD ? f / kv_heads : blockIdx.z;
    int j = SPLIT ? tile % T_c : BY_COLUMN ? blockIdx.y : blockIdx.x;
    if constexpr (ORDERED) {
        if (tid == 0) {
            const int nbatch = BY_HEAD ? gridDim.x * gridDim.z / kv_heads : gridDim.z;
            int* tickets = p.dq_order + (long long)nbatch * nheads * T_r;  // (after the turns)
            *reinterpret_cast<int*>(generic(sTicket)) =
                atomicAdd(tickets + batch * kv_heads + head_k, 1);
        }
        __syncthreads();
        j = T_c - 1 - ld_shared_s32(sTicket);
    }
    // This batch entry's lengths and rows (seqinfo.cuh; packed: the entry's own, while the
    // grid's T_c is the longest entry's: a column block past the entry's keys has no work).
    const SeqInfo seq = SeqT::info(p, batch);
    const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
    if (SeqT::PACKED && j * B_c >= seqlen_k) return;
    // Row block i of query head h in the float32 row blocks of dQ_accum, L log2 e and D:
    // dense (batch, heads, T_r); packed (heads, p.ws_blocks), the entry's from
    // p.row_block_offsets[batch] (cuflash/_api.py, _packed_dq_workspace)
    auto row_block_index = [&](int h, int i) -> long long {
        if constexpr (SeqT::PACKED)
            return (long long)h * p.ws_blocks + p.row_block_offsets[batch] + i;
        else
            return ((long long)batch * nheads + h) * T_r + i;
    };
    const MaskT mask(p, seqlen_q, seqlen_k);
    // The steps: every row block i that sees column block j (block_range.cuh), for each query
    // head h of the group in turn; the tile's step u is (h, i) = (head_k group + u / n,
    // begin + u % n). The block's step t is the tile's t0 + t (SPLIT: its part's share).
    const RowBlocks rb = row_blocks<B_r, B_c>(mask, j);
    const int n = rb.end - rb.begin, t0 = part * (n * p.group) / parts;
    const int steps = (part + 1) * (n * p.group) / parts - t0;
    auto step_head = [&](int t) { return head_k * p.group + (t0 + t) / n; };
    auto step_row_block = [&](int t) { return rb.begin + (t0 + t) % n; };

    // How dQ_ij reaches dQ_accum. DQ_RED: 16-byte vector reductions from the registers. Else
    // through shared memory: the consumer stores its group's tile and a mailbox and signals
    // dq_full; the producer thread waits for the row block's turn (ORDERED), issues one bulk
    // reduction per group (rank 0 of the ordered mode: a bulk store), frees the tiles
    // (dq_empty) once read, and (ORDERED) hands the turn on once completed: the consumers
    // never wait on a turn or on a bulk operation's completion (the ordered mode's cost,
    // 1.2-1.5x, sat there: both consumers met at every step behind thread 0's turn; 1.0-1.1x
    // once moved, session 15).
    // Measured on the H200 (session 14, bf16): the reductions 5-10% faster at d 64 and 1-3%
    // causal at d 128, but 4-10% slower at d 128 non-causal, where every column block of a
    // head adds into the same row block at once, two groups per step. With dK's product after
    // dQ's (DK_EARLY below) the d 128 causal kernels took 0.4-1.9% less time through shared
    // memory (session 22); those with the hook keep the reductions (through shared memory
    // they would need dK wholly before dQ, where the reductions measured faster).
    constexpr bool DQ_RED =
        !ORDERED && (GROUPS < CONSUMERS || (MaskT::CAUSAL && ScoreT::REWRITES));
    // the dQ tiles consumer c has stored before step t: group (c + t) % CONSUMERS each step
    // while it is < GROUPS (d 128: every step; d 64: every other step, from step c)
    auto dq_tiles_before = [&](int c, int t) {
        return GROUPS == CONSUMERS ? t : (t + CONSUMERS - 1 - c) / CONSUMERS;
    };

    // The dQ pass is this kernel's dependent launch: its blocks may start on the SMs that the
    // last round of these leaves free, and wait there (grid_dependency_wait) for this grid.
    launch_dependents();
    if (tid == 0) {
        mbar_init(kv_full, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), 1);
            mbar_init(free_slot(s), 4 * CONSUMERS);  // one arrival per consumer warp
        }
        for (int c = 0; c < CONSUMERS; ++c) {
            mbar_init(dq_full(c), 4);  // one arrival per warp of consumer c
            mbar_init(dq_empty(c), 1);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warpgroup == 0) {
        // ---- producer ----------------------------------------------------------------------
        regs_decrease<Tile::PRODUCER_REGS>();
        if (tid == 0) {  // TMA: K_j and V_j once, then Q_i and dO_i of each step
            // Bulk path (!DQ_RED): this thread also adds the consumers' dQ tiles of each step
            // into dQ_accum (ORDERED: in the row block's turn), once the consumers have freed
            // the step's slot: where and in which turn each goes comes from its consumer's
            // mailbox. (A second thread for it, even doing nothing, made this loop spill in
            // its 24 registers.)
            auto add_dq_tiles = [&](int t) {
                // the step's groups (both consumers' at d 128: one row block, one rank) issued
                // before one read wait and one completion wait
                int* turn = nullptr;  // ORDERED: the row block's counter, where it takes a turn
#pragma unroll
                for (int c = 0; c < CONSUMERS; ++c) {
                    if ((c + t) % CONSUMERS >= GROUPS) continue;
                    mbar_wait(dq_full(c), dq_tiles_before(c, t) & 1);
                    const DqMail mail = *reinterpret_cast<const DqMail*>(generic(sMail(c)));
                    if (ORDERED && mail.rank >= 0) {
                        turn = p.dq_order + mail.row_block;
                        if (mail.rank > 0) wait_counter_at_least(turn, GROUPS * mail.rank);
                    }
                    if (ORDERED && mail.rank == 0)
                        bulk_store(mail.dst, sdQ(c), Tile::DQ_BYTES);
                    else if (mail.rank > 0)
                        bulk_reduce_add_f32(mail.dst, sdQ(c), Tile::DQ_BYTES);
                }
                bulk_wait_read<0>();  // read: the consumers may store their next tiles
#pragma unroll
                for (int c = 0; c < CONSUMERS; ++c)
                    if ((c + t) % CONSUMERS < GROUPS) mbar_arrive(dq_empty(c));
                if (ORDERED && turn) {  // completed: the turn passes on, once per group
                    bulk_wait();
                    for (int g = 0; g < GROUPS; ++g) add_counter(turn);
                }
            };
            mbar_arrive_expect_tx(kv_full, 2 * Tile::KV_BYTES);
            for (int g = 0; g < GROUPS; ++g) {
                tma_load_4d(sK + g * (B_c * 128), &p.tm_k, kv_full, g * 64,
                            seq.k_row0() + j * B_c, head_k, seq.k_batch());
                tma_load_4d(sV + g * (B_c * 128), &p.tm_v, kv_full, g * 64,
                            seq.k_row0() + j * B_c, head_k, seq.k_batch());
            }
            // (this kernel is the D pass's dependent launch: L log2 e, D and dQ_accum's zeros
            // are read or added into from here on; K_j and V_j, inputs, load while it ends)
            grid_dependency_wait();
            // L_i log2(e) and D_i: one aligned bulk copy each from the preprocess's padded rows
            for (int t = 0; t < steps; ++t) {
                const int stage = t % STAGES, h = step_head(t), i = step_row_block(t);
                mbar_wait(free_slot(stage), ((t / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(full(stage), 2 * Tile::ROW_BYTES + 2 * Tile::VEC_BYTES);
                for (int g = 0; g < GROUPS; ++g) {
                    tma_load_4d(sQ(stage) + g * (B_r * 128), &p.tm_q, full(stage), g * 64,
                                seq.q_row0() + i * B_r, h, seq.q_batch());
                    tma_load_4d(sdO(stage) + g * (B_r * 128), &p.tm_do, full(stage), g * 64,
                                seq.q_row0() + i * B_r, h, seq.q_batch());
                }
                const long long at = row_block_index(h, i) * B_r;
                bulk_load(sL(stage), p.lse_log2 + at, Tile::VEC_BYTES, full(stage));
                bulk_load(sD(stage), p.dsum + at, Tile::VEC_BYTES, full(stage));
                // step t - STAGES freed its slot (the wait above): its dQ tiles follow
                if (!DQ_RED && t >= STAGES) add_dq_tiles(t - STAGES);
            }
            if constexpr (!DQ_RED) {
                for (int t = steps < STAGES ? 0 : steps - STAGES; t < steps; ++t)
                    add_dq_tiles(t);
                bulk_wait();
            }
        }
        return;
    }

    // ---- consumers ----------------------------------------------------------------------
    regs_increase<Tile::CONSUMER_REGS>();
    grid_dependency_wait();  // (the D pass's zeros, before any reduction into dQ_accum)
    const int wg = warpgroup - 1;  // which 64 keys of K_j: 64 wg ..
    const int warp = (tid / 32) % 4, lane = tid % 32;
    const int key_lane = j * B_c + 64 * wg + 16 * warp + lane / 4;  // + 8 e2: this lane's keys
    const unsigned k_rows = sK + wg * 64 * 128, v_rows = sV + wg * 64 * 128;  // (group 0)
    auto release = [&](unsigned bar) {  // one arrival per warp
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };

    // The step's two kinds of product, issued and committed (not awaited):
    // acc = A B^T, A this consumer's 64 rows of K_j or V_j (from a_rows), B the B_r rows of
    // Q_i or dO_i (b_rows), both K-major: HD / 16 k-steps, step kk reading 16 head-dim columns
    // (group kk / 4, byte 32 (kk % 4) of the 128-byte rows). (The caller fences: the two of a
    // step go out after one wgmma_fence.)
    auto issue_rows_by_rows = [&](float (&acc)[NT_S][4], unsigned a_rows, unsigned b_rows) {
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            const unsigned off = (kk % 4) * 32;
            Wgmma<T, B_r>::ss(acc, smem_desc(a_rows + (kk / 4) * (B_c * 128) + off, 0, 1024),
                              smem_desc(b_rows + (kk / 4) * (B_r * 128) + off, 0, 1024),
                              kk > 0);
        }
        wgmma_commit();
    };
    // acc += A B, A the A fragments `a` of an accumulator of S^T's shape (P^T or dS^T; n8
    // tiles 2 kk, 2 kk + 1 are k-step kk's), B the B_r rows of dO_i or Q_i (b_rows), N-major:
    // B_r / 16 k-steps of m64 n HD k16, k-step kk 16 rows down
    // (k-steps [k0, k1) only, where given: a product issued in two commit groups)
    auto issue_packed_by_rows = [&](float (&acc)[NT_D][4], const unsigned (&a)[B_r / 16][4],
                                    unsigned b_rows, int k0 = 0, int k1 = Tile::B_r / 16) {
        wgmma_fence();
#pragma unroll
        for (int kk = k0; kk < k1; ++kk)
            Wgmma<T, HD>::rs(acc, a[kk], smem_desc(b_rows + kk * 16 * 128, B_r * 128, 1024), 1);
        wgmma_commit();
    };
    // the same with A = `s`, packed into `a` first
    auto issue_registers_by_rows = [&](float (&acc)[NT_D][4], unsigned (&a)[B_r / 16][4],
                                       const float (&s)[NT_S][4], unsigned b_rows) {
#pragma unroll
        for (int kk = 0; kk < B_r / 16; ++kk) pack_a_fragment<T>(a[kk], s, kk);
        issue_packed_by_rows(acc, a, b_rows);
    };

    float dv[NT_D][4], dk[NT_D][4];  // dV_j, dK_j: this consumer's 64 keys x HD
    zero(dv);
    zero(dk);
    mbar_wait(kv_full, 0);

    for (int t = 0; t < steps; ++t) {
        // ---- one step: row block i of query head h ---------------------------------------
        const int stage = t % STAGES, h = step_head(t), i = step_row_block(t);
        mbar_wait(full(stage), (t / STAGES) & 1);

        // S^T = K_j Q_i^T and dP^T = V_j dO_i^T (64 keys x B_r queries). LATE_DP (the score
        // hook at d 128): dP^T is issued after the hook's pass, behind dV's product, so that
        // its accumulators are not held through the pass (held, the pass spilled 8-88 bytes
        // there: session 14's compile check).
        constexpr bool LATE_DP = ScoreT::REWRITES && HD > 64;
        float st[NT_S][4], dpt[NT_S][4];
        wgmma_fence();
        issue_rows_by_rows(st, k_rows, sQ(stage));
        if constexpr (!LATE_DP) issue_rows_by_rows(dpt, v_rows, sdO(stage));
        // L_i log2 e along the columns (this lane's queries 8 nt + 2 (lane % 4) + e1), read
        // while the products run: read after the wait, these loads queued behind the
        // products' own shared-memory reads and the first exponent waited on them (ncu,
        // session 14). (Not with a window in the ordered mode: 4 bytes spilled there at d 128.)
        Float2 l2[NT_S];
        auto load_l2 = [&] {
            const float* L2 = reinterpret_cast<const float*>(generic(sL(stage)));
#pragma unroll
            for (int nt = 0; nt < NT_S; ++nt)
                l2[nt] = *reinterpret_cast<const Float2*>(L2 + nt * 8 + (lane % 4) * 2);
        };
        constexpr bool EARLY_L = !(ORDERED && MaskT::LOCAL);
        if constexpr (EARLY_L) load_l2();
        wgmma_wait<LATE_DP ? 0 : 1>();  // S^T is done (dP^T may still run; LATE_DP: not issued)
        fence_accumulators(st);
        if constexpr (!EARLY_L) load_l2();

        // P^T = exp2(scale_log2 S^T - L_i log2 e): mask (mask.cuh) on blocks that cross a
        // limit
        const bool masked = block_needs_mask<B_r, B_c>(mask, i, j);
        if (masked) mask_fragment_transposed(mask, st, key_lane, i * B_r, lane);
        unsigned pa[B_r / 16][4];
        if constexpr (ScoreT::REWRITES) {
            // With the score hook (score.cuh), each element in one pass: S^T hooked, P^T,
            // packed into dV's A fragments, and in st P^T times the hook's derivative (the
            // softcap's 1 - tanh^2), all that dS needs of it: no array beside st for the
            // derivative (a second one spilled at d 128). ALiBi's distance of element e of n8
            // tile nt: query 8 nt + e % 2, key 8 (e / 2) past the lane's first (dist0),
            // compile-time offsets.
            const ScoreT hook(p, batch, h);  // (this step's query head)
            const float dist0 = hook.template diagonal<shifted_diagonal<SeqT, MaskT>()>(
                p, i * B_r + 2 * (lane % 4), key_lane, seqlen_q, seqlen_k);
            // One straight loop per combination, the features tested once per step (uniform):
            //   SOFTCAP alone: exponent tanh(S^T scale / softcap) (softcap log2 e) - L_i log2 e,
            //     the factors folded into p.softcap_log2 (score.cuh);
            //   ALIBI: S^T hooked in S's units, then the plain exponent;
            //   TEST (the softcap on a masked block): hidden elements are -inf, which the
            //     softcap would bring back to -softcap; they give P = 0. Without the softcap
            //     -inf stays -inf (P = exp2(-inf) = 0), and unmasked blocks have none.
            auto hooked = [&](auto softcap, auto alibi, auto test) {
                constexpr bool SOFTCAP = decltype(softcap)::value, ALIBI = decltype(alibi)::value;
                constexpr bool TEST = decltype(test)::value;
#pragma unroll
                for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
                    for (int e2 = 0; e2 < 2; ++e2) {
                        float pe[2];
#pragma unroll
                        for (int e1 = 0; e1 < 2; ++e1) {
                            const float s_raw = st[nt][2 * e2 + e1];
                            float x = s_raw, dfactor = 1.f, exponent_scale = p.scale_log2;
                            if constexpr (SOFTCAP) {  // (alone: the factors folded)
                                x = ScoreHook::softcap<!ALIBI>(p, s_raw, dfactor);
                                if constexpr (!ALIBI) exponent_scale = p.softcap_log2;
                            }
                            if constexpr (ALIBI)
                                x = hook.alibi(x, dist0 + static_cast<float>(8 * nt + e1 - 8 * e2));
                            const float l = e1 ? l2[nt].y : l2[nt].x;
                            pe[e1] = TEST && s_raw == CUFLASH_NEG_INF
                                         ? 0.f
                                         : exp2_approx(fmaf(x, exponent_scale, -l));
                            st[nt][2 * e2 + e1] = SOFTCAP ? pe[e1] * dfactor : pe[e1];
                        }
                        pa[nt / 2][2 * (nt % 2) + e2] = T::pack(pe[0], pe[1]);
                    }
            };
            // FAST: a loop per combination (five) where they fit (d 64, dense, not ORDERED:
            // the others spilled 8-68 bytes with them, session 17's compile check); elsewhere
            // two, each with the test, the softcap's with ALiBi's term (a slope of 0 adds
            // nothing), tested in that order (the other order spilled the ordered d 64
            // kernels: a register-allocation accident).
            constexpr bool FAST = HD == 64 && !ORDERED && !SeqT::PACKED;
            using Y = Int<1>;
            using N = Int<0>;
            if constexpr (!FAST) {
                if (p.softcap_in != 0.f)
                    hooked(Y{}, Y{}, Y{});
                else
                    hooked(N{}, Y{}, Y{});
            } else if (p.softcap_in == 0.f) {
                hooked(N{}, Y{}, N{});
            } else if (p.alibi_slopes == nullptr) {
                masked ? hooked(Y{}, N{}, Y{}) : hooked(Y{}, N{}, N{});
            } else {
                masked ? hooked(Y{}, Y{}, Y{}) : hooked(Y{}, Y{}, N{});
            }
            // dV_j += P^T dO_i: P^T from registers, dO_i N-major
            issue_packed_by_rows(dv, pa, sdO(stage));
            if constexpr (LATE_DP) {  // dP^T = V_j dO_i^T, now
                wgmma_fence();
                issue_rows_by_rows(dpt, v_rows, sdO(stage));
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < NT_S; ++nt) {
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2) {
                    st[nt][2 * e2] = exp2_approx(fmaf(st[nt][2 * e2], p.scale_log2, -l2[nt].x));
                    st[nt][2 * e2 + 1] =
                        exp2_approx(fmaf(st[nt][2 * e2 + 1], p.scale_log2, -l2[nt].y));
                }
            }
            // dV_j += P^T dO_i: P^T from registers, dO_i N-major
            issue_registers_by_rows(dv, pa, st, sdO(stage));
        }
        wgmma_wait<LATE_DP ? 0 : 1>();  // dP^T is done (dV may still run; LATE_DP: done)
        fence_accumulators(dpt);

        // dS^T = P^T ∘ (dP^T - D_i), D_i along the columns (with the hook, st holds P^T times
        // its derivative)
        const float* D = reinterpret_cast<const float*>(generic(sD(stage)));
#pragma unroll
        for (int nt = 0; nt < NT_S; ++nt) {
            const Float2 dr = *reinterpret_cast<const Float2*>(D + nt * 8 + (lane % 4) * 2);
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                dpt[nt][2 * e2] = st[nt][2 * e2] * (dpt[nt][2 * e2] - dr.x);
                dpt[nt][2 * e2 + 1] = st[nt][2 * e2 + 1] * (dpt[nt][2 * e2 + 1] - dr.y);
            }
        }
        // dK_j += dS^T Q_i (as dV, Q_i N-major). Its first DK_EARLY of B_r / 16 k-steps now,
        // the rest after dQ's product (DK_SPLIT), so that dQ's result is read and stored while
        // they run: a wait for dQ at the step's end left the tensor cores without work there
        // (ncu, session 14), and the next step's products could not start before that store.
        // None early where that compiles spill-free and measured faster: the causal kernels
        // without the hook at d 64 and 128 (0.6-2.0% less time than 4 or 3 early, session 23)
        // and every non-causal kernel at d 128 (4-7%, session 22). The d 64 non-causal
        // kernels keep dK whole before dQ (1.0-1.3% slower with none early: at d 64 a consumer
        // has dQ every other step, and then waits for all but dK's k-steps whether or not it
        // had dQ), as do the causal kernels with the hook (d 128: 12-20 bytes spilled with
        // fewer than all early; d 64: not measured) and the ordered mode (the ordered d 128
        // backward took 2-10% more time at n 4k-16k with none early: session 22's grid).
        constexpr int DK_EARLY = ORDERED || (MaskT::CAUSAL && ScoreT::REWRITES) ||
                                         (GROUPS < CONSUMERS && !MaskT::CAUSAL)
                                     ? B_r / 16
                                     : 0;
        constexpr bool DK_SPLIT = DK_EARLY < B_r / 16;
        unsigned dsa[B_r / 16][4];
#pragma unroll
        for (int kk = 0; kk < B_r / 16; ++kk) pack_a_fragment<T>(dsa[kk], dpt, kk);
        if constexpr (DK_EARLY > 0) issue_packed_by_rows(dk, dsa, sQ(stage), 0, DK_EARLY);

        // dS^T to shared memory (this consumer's 64 keys x B_r queries, 128-byte swizzle: the
        // 16-byte chunk nt of row r at chunk nt ^ (r % 8)), for dQ_i += dS_ij K_j. The pair of
        // n8 tile nt, row half e2 is dsa[nt / 2][2 (nt % 2) + e2] (pack_a_fragment).
        const int buf = t & 1;
        unsigned char* ds_tile = generic(sdS(buf, wg));
#pragma unroll
        for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2) {
                const int r = 16 * warp + lane / 4 + 8 * e2;
                *reinterpret_cast<unsigned*>(ds_tile + r * 128 + ((nt ^ (r % 8)) * 16) +
                                             (lane % 4) * 4) = dsa[nt / 2][2 * (nt % 2) + e2];
            }
        fence_proxy_async_shared();     // (the dS^T stores, for wgmma's reads)
        named_barrier_sync(1, 256);     // both consumers' dS^T are in

        // dQ_i += dS_ij K_j, 64-column group g = (wg + t) % 2 (if the head dim has it: at d 64
        // the consumers take every other step): m64 n64, B_c / 16 k-steps over the keys, dS
        // read M-major from consumer kk / 4's dS^T (16 keys: rows 16 (kk % 4)), K_j N-major
        // (rows 16 kk of group g)
        const int g = (wg + t) % CONSUMERS;
        const bool dq_mine = g < GROUPS;
        float dq[8][4];
        if (dq_mine) {
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < B_c / 16; ++kk)
                Wgmma<T, 64>::ss_mn(dq,
                                    smem_desc(sdS(buf, kk / 4) + (kk % 4) * 16 * 128, 0, 1024),
                                    smem_desc(sK + g * (B_c * 128) + kk * 16 * 128, B_c * 128,
                                              1024),
                                    kk > 0);
            wgmma_commit();
        }
        // (once every product of the step is done: the slot and both dS^T are read)
        auto step_done = [&] {
            fence_accumulators(dv);
            fence_accumulators(dk);
            release(free_slot(stage));
        };
        if constexpr (DK_SPLIT) {
            issue_packed_by_rows(dk, dsa, sQ(stage), DK_EARLY, B_r / 16);
            wgmma_wait<1>();  // dV (and dQ where this step has it) is done; dK runs
        } else {
            wgmma_wait<0>();  // dV, dK and dQ are done
            step_done();
        }
        if (dq_mine) {
            fence_accumulators(dq);
            if constexpr (DQ_RED) {
                // dQ_ij's group g added into row block i of dQ_accum (batch, heads, T_r,
                // B_r x HD) straight from the registers, in fragment order: one 16-byte
                // reduction per n8 tile, a warp's 32 contiguous in 512 bytes (no staging, no
                // barrier: the next step's products start at once)
                float* mine = p.dq_accum + row_block_index(h, i) * (B_r * HD) + g * (B_r * 64) +
                              (warp * 8 * 32 + lane) * 4;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
                    red_add_f32x4(true, mine + nt * 32 * 4, dq[nt][0], dq[nt][1], dq[nt][2],
                                  dq[nt][3]);
            } else {
                // The group to shared memory in the same order, once the producer's bulk
                // operation has read this consumer's last one; the producer adds it
                // (ORDERED: in its row block's turn)
                const int before = dq_tiles_before(wg, t);
                if (before > 0) mbar_wait(dq_empty(wg), (before - 1) & 1);
                unsigned char* q_tile = generic(sdQ(wg));
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
                    *reinterpret_cast<Float4*>(q_tile + (((warp * 8 + nt) * 32 + lane) * 16)) =
                        Float4{dq[nt][0], dq[nt][1], dq[nt][2], dq[nt][3]};
                if (tid % 128 == 0) {
                    // rank: ORDERED, this addition's place in its row block's order (0 stores;
                    // < 0: row_blocks can hand a block a padded last row block that sees none
                    // of its keys, with a window's right side below zero, from ring
                    // attention's shifts: its dQ_ij is 0 and it takes no turn); else 1, add
                    const long long row_block = row_block_index(h, i);
                    *reinterpret_cast<DqMail*>(generic(sMail(wg))) = DqMail{
                        p.dq_accum + row_block * (B_r * HD) + g * (B_r * 64),
                        static_cast<int>(row_block),
                        ORDERED ? column_blocks<B_r, B_c>(mask, i).end - 1 - j : 1};
                }
                fence_proxy_async_shared();
                release(dq_full(wg));
            }
        }
        if constexpr (DK_SPLIT) {
            wgmma_wait<0>();  // dK is done too
            step_done();
        }
    }

    // ---- epilogue: dK_j (times scale) and dV_j, keys past the end of K not stored ------------
#pragma unroll
    for (int nt = 0; nt < NT_D; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[nt][e] *= p.softmax_scale;

    // ---- the split tail: a split tile's parts summed -----------------------------------
    // The grid's blocks run in rounds of one per SM, and tiles of equal work (no mask) leave
    // the last round part empty where their number is not a multiple of the SMs' (d 128, 16k
    // tokens: 2048 tiles on 132 SMs, 15.5 rounds of work in 16). So the host splits the last
    // tiles by row steps into p.tail_parts parts, which fill the last round more evenly
    // (cuflash/_registry.py, sm90_backward_split). Each part adds its dK_j, dV_j into the
    // tile's float32 sum in p.tail_acc (fragment order, a warp's 16 keys contiguous) by
    // 16-byte reductions; each warp then counts itself in, and the last to count in loads the
    // sums (its own part in them), sets them back to 0 for the next launch, and stores:
    //     dK_j = sum over parts of dK_j',  dV_j = sum over parts of dV_j'
    if (SPLIT && blockIdx.x >= p.tail_whole) {
        const int split_tile = split_block().tile - p.tail_whole;
        constexpr int WARP_FLOATS = NT_D * 32 * 4;  // one warp's 16 keys of dK_j or dV_j
        float* acc = p.tail_acc +
                     ((size_t)split_tile * CONSUMERS * 4 + wg * 4 + warp) * 2 * WARP_FLOATS +
                     lane * 4;
#pragma unroll
        for (int nt = 0; nt < NT_D; ++nt) {
            red_add_f32x4(true, acc + nt * 128, dk[nt][0], dk[nt][1], dk[nt][2], dk[nt][3]);
            red_add_f32x4(true, acc + WARP_FLOATS + nt * 128, dv[nt][0], dv[nt][1], dv[nt][2],
                          dv[nt][3]);
        }
        __threadfence();  // (this lane's reductions, before its warp's count)
        __syncwarp();
        const int flag = (split_tile * CONSUMERS + wg) * 4 + warp;
        if (!count_in_last(p.tail_flags + flag, p.tail_parts, lane)) return;  // (another stores)
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int nt = 0; nt < NT_D; ++nt) {
            float4* x = reinterpret_cast<float4*>(acc + nt * 128);
            float4* y = reinterpret_cast<float4*>(acc + WARP_FLOATS + nt * 128);
            const float4 a = __ldcg(x), b = __ldcg(y);
            dk[nt][0] = a.x, dk[nt][1] = a.y, dk[nt][2] = a.z, dk[nt][3] = a.w;
            dv[nt][0] = b.x, dv[nt][1] = b.y, dv[nt][2] = b.z, dv[nt][3] = b.w;
            __stcg(x, zero);
            __stcg(y, zero);
        }
    }
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
        const int key = key_lane + 8 * e2;
        const long long at = seq.k_offset(p.dk_stride_b, p.dk_stride_s) + key * p.dk_stride_s +
                             head_k * p.dk_stride_h;
        store_accumulator_row<T>(dk, e2, static_cast<elem_t*>(p.dk) + at, key < seqlen_k, p.d,
                                 lane);
        store_accumulator_row<T>(dv, e2, static_cast<elem_t*>(p.dv) + at, key < seqlen_k, p.d,
                                 lane);
    }
}

}  // namespace cuflash
