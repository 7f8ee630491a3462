// fa2_forward_sm90.cu: FlashAttention-2 forward on Hopper (sm_90a): TMA loads, wgmma, warp
// specialisation. The same algorithm as fa2_forward.cu (the seed document, section 2.4.1.1):
//   one tile per (row block i of Q, head, batch); for each column block j:
//       S_ij   = Q_i K_j^T                               (wgmma, Q_i and K_j in shared memory)
//       m_new  = max(m_i, rowmax(S_ij))
//       P~_ij  = exp(S_ij - m_new)
//       l_i    = e^(m_i - m_new) l_i + rowsum(P~_ij)
//       O~_i   = diag(e^(m_i - m_new)) O~_i + P~_ij V_j  (wgmma, P~ from registers)
//       m_i    = m_new
//   and at the end  O_i = diag(l_i)^-1 O~_i,  L_i = m_i + log(l_i).
// The inner loop is under "the FA2 inner loop, on wgmma" below: S_ij, wait, mask and
// softmax, P~_ij V_j. Three schedules of it (ForwardTileSm90): PINGPONG (on in the tile
// table), the consumers take turns on the tensor cores so that one's softmax runs under the
// others' matmuls (FlashAttention-3's inter-warpgroup overlap); OVERLAP (off: measured
// slower, PERFORMANCE.md), S for block j + 1 on the tensor cores while the softmax of block j
// runs (FA3's intra-warpgroup overlap); neither, each consumer on its own.
//
// Work split (warpgroups of 128 threads):
//   warpgroup 0, the producer: two threads issue the TMA loads (one consumer 0's rows of Q_i
//     and K_j, the other the other consumers' rows and V_j, into a ring of STAGES shared-
//     memory slots) and the warpgroup gives its registers to the consumers;
//   warpgroups 1 .. CONSUMERS (2, or 3 at small head dims), the consumers: each owns 64 of
//     the B_r = 64 CONSUMERS rows of Q_i and runs the loop above on them; a consumer frees a
//     slot (an mbarrier arrival per warp) once its
//     matmuls have read it (K_j after S_ij, V_j after P~V, which with PINGPONG or OVERLAP is
//     known a step later).
// A thread block takes tiles (row block, head, batch) in turn (see "the tiles" below).
// Each slot has four mbarriers: K_j landed, V_j landed (separate, so that S = Q K^T starts
// before V_j is in), K_j read, V_j read (separate, so that K_(j+2) can load while P~V still
// reads V_j: with the overlap, step j issues S for block j + 1 before P~V of j - 1 is known
// to be done, and a slot shared by K and V would deadlock two stages).
//
// Shared-memory layout: every tile is stored as TMA writes it with the 128-byte swizzle, in
// column groups of 64 head-dim elements (128 bytes per row): tile[g][row][64], HD / 64 groups.
// The wgmma descriptors (hopper.cuh, smem_desc) read that layout directly: Q and K K-major
// (the head dim is the k of S = Q K^T), V N-major (the head dim is the n of P V).
//
// Pieces shared with the portable kernels: seqinfo.cuh (the rows of a batch entry),
// mask.cuh and block_range.cuh (which keys a row sees, which column blocks a row block
// visits), score.cuh (the score hook), softmax.cuh (the online softmax: the wgmma
// accumulator has the mma.sync row-per-quad layout, so it runs unchanged).
//
// Variants (template parameters; cuflash/_plan.py picks them):
//   T        fp16 | bf16
//   Tile = ForwardTileSm90<HD, B_c, STAGES, OVERLAP, ...>: HD the head dim padded to a
//            multiple of 64 (the real d is zero-filled by TMA past its end), B_c keys per
//            column block, STAGES K/V slots, OVERLAP the intra-warpgroup overlap of S_(j+1)
//            with softmax_j; then PINGPONG, the softmax's options, CONSUMERS and HANDOVER
//            (the struct below)
//   MaskT = Mask<CAUSAL, LOCAL> (LOCAL: a sliding window's lower limit)
//   ScoreT = ScoreScale | ScoreHook (score.cuh: softcap and ALiBi)
//   SeqT = DenseSeq | PackedSeq (seqinfo.cuh: packed = variable-length batches)
#include "common.cuh"
#include "hopper.cuh"
#include "params.cuh"
#include "seqinfo.cuh"
#include "mask.cuh"
#include "block_range.cuh"
#include "score.cuh"
#include "softmax.cuh"

namespace cuflash {

template <int HD_, int B_c_, int STAGES_, bool OVERLAP_, bool PINGPONG_ = false,
          bool LAZY_RESCALE_ = false, int POLY_EVERY_ = 0, int CONSUMERS_ = 2,
          bool HANDOVER_ = true>
struct ForwardTileSm90 {
    // CONSUMERS warpgroups of 64 query rows each (2, or 3 where a small head dim leaves the
    // registers: three take turns, so that two softmaxes run under each one's matmuls).
    static constexpr int CONSUMERS = CONSUMERS_;
    static constexpr int HD = HD_, B_r = 64 * CONSUMERS, B_c = B_c_, STAGES = STAGES_;
    // OVERLAP: S for block j + 1 is computed while the softmax of block j runs (a second S
    // buffer in registers: on where it fits without spills, see cuflash/_plan.py).
    static constexpr bool OVERLAP = OVERLAP_;
    // PINGPONG: the consumers take turns on the tensor cores, each one's softmax running
    // under the others' matmuls (P~V of a block is issued with the next block's S).
    static constexpr bool PINGPONG = PINGPONG_;
    static_assert(!(OVERLAP && PINGPONG), "one schedule: OVERLAP or PINGPONG");
    // HANDOVER (with PINGPONG): the turns run on across tiles, the last consumer handing
    // consumer 0 the next tile's first turn as soon as its own last P~V is issued (see the
    // consumers' tile loop); off, each tile's turns start afresh once the last consumer has
    // finished the tile before (its epilogue included). Off only where the hand-over's code
    // after the tile loop pushed a register-tight tile into spills (cuflash/_plan.py).
    static constexpr bool HANDOVER = PINGPONG && HANDOVER_;
    // The online softmax's options (softmax.cuh), named as in the portable ForwardTile:
    // LAZY_RESCALE of O~_i (m_i moves only past 2^RESCALE_LOG2 in P~), and the exponentials
    // of every POLY_EVERY-th n8 tile of keys on the FMA pipe (0: all on MUFU).
    static constexpr bool LAZY_RESCALE = LAZY_RESCALE_;
    static constexpr int RESCALE_LOG2 = 8;
    static constexpr int POLY_EVERY = POLY_EVERY_;
    static constexpr int NTHREADS = 128 * (1 + CONSUMERS);  // producer + consumer warpgroups
    static constexpr int GROUPS = HD / 64;   // 64-column groups of the head dim
    static constexpr int NT_S = B_c / 8;     // n8 tiles across S_ij (per consumer: 64 rows)
    static constexpr int NT_O = HD / 8;      // n8 tiles across O~_i
    // Shared memory (bytes): Q_i, STAGES x (K_j, V_j), then the mbarriers; 1024 more so that
    // the tiles can start on a 1024-byte boundary whatever the base.
    static constexpr int Q_BYTES = B_r * HD * 2;
    static constexpr int KV_BYTES = B_c * HD * 2;  // one of K_j, V_j
    static constexpr int BAR_BYTES = 8 * (2 * CONSUMERS + 4 * STAGES);
    // The tile ring of packed batches' scheduler ("the tiles" below): SCHED_SLOTS tiles of
    // 16 bytes and two mbarriers each (tile written, tile read by every role).
    static constexpr int SCHED_SLOTS = 4, SCHED_BYTES = SCHED_SLOTS * (16 + 2 * 8);
    static constexpr int SMEM_BYTES =
        1024 + Q_BYTES + 2 * STAGES * KV_BYTES + BAR_BYTES + SCHED_BYTES;
    // setmaxnreg moves registers between warpgroups of the block: the consumers' increase
    // waits until the producer's decrease has freed enough of what the launch allocated
    // (__launch_bounds__(NTHREADS, 1): 168 per thread with 384, 128 with 512). Asking for more
    // than that hangs the block. Three consumers take 160 each and leave the producer 32
    // (3 x 160 + 32 = 512 per thread of a warpgroup, the whole register file): at 152 ptxas
    // serialized the wgmma of B_c 128 at d 64 (C7512, no spill, 28-37% slower).
    static constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 160,
                         PRODUCER_REGS = CONSUMERS == 2 ? 40 : 32;
    static_assert(PRODUCER_REGS * 128 + CONSUMERS * CONSUMER_REGS * 128 <=
                      65536 / NTHREADS / 8 * 8 * NTHREADS,
                  "setmaxnreg: the warpgroups ask for more registers than the launch has");
    static_assert(CONSUMERS == 2 || CONSUMERS == 3, "two or three consumer warpgroups");

    static_assert(HD % 64 == 0 && HD <= 256, "head dim padded to a multiple of 64, <= 256");
    static_assert(B_c % 16 == 0 && B_c <= 256, "B_c: whole k16 steps of P V, one wgmma");
    static_assert(STAGES >= 2, "at least two K/V slots");
};

template <typename T, typename Tile, typename MaskT, typename ScoreT = ScoreScale,
          typename SeqT = DenseSeq>
__global__ void __launch_bounds__(Tile::NTHREADS, 1)
fa2_forward_sm90(const __grid_constant__ Sm90FwdParams p) {
    constexpr int HD = Tile::HD, B_r = Tile::B_r, B_c = Tile::B_c, STAGES = Tile::STAGES;
    constexpr int GROUPS = Tile::GROUPS, NT_S = Tile::NT_S, NT_O = Tile::NT_O;
    using Score = ScoreT;

    // Shared memory, carved from a 1024-byte aligned base: Q_i, K slots, V slots, barriers.
    extern __shared__ __attribute__((aligned(1024))) unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned sQ = base;
    auto sK = [&](int stage) { return sQ + Tile::Q_BYTES + stage * Tile::KV_BYTES; };
    auto sV = [&](int stage) {
        return sQ + Tile::Q_BYTES + (STAGES + stage) * Tile::KV_BYTES;
    };
    // (Q_i's barriers per consumer: each consumer's 64 rows are loaded and freed on their own)
    const unsigned bars = sQ + Tile::Q_BYTES + 2 * STAGES * Tile::KV_BYTES;
    constexpr int QB = 2 * Tile::CONSUMERS;  // (Q_i's barriers, before the K/V slots')
    auto q_full = [&](int c) { return bars + 8 * c; };
    auto q_free = [&](int c) { return bars + 8 * (Tile::CONSUMERS + c); };
    auto k_full = [&](int stage) { return bars + 8 * (QB + stage); };
    auto v_full = [&](int stage) { return bars + 8 * (QB + STAGES + stage); };
    auto k_free = [&](int stage) { return bars + 8 * (QB + 2 * STAGES + stage); };
    auto v_free = [&](int stage) { return bars + 8 * (QB + 3 * STAGES + stage); };
    // The scheduler's ring (packed batches): slot t's tile, "written" and "read" barriers.
    const unsigned sched = bars + Tile::BAR_BYTES;
    auto sched_tile = [&](int t) { return sched + 16 * t; };
    auto sched_full = [&](int t) { return sched + 16 * Tile::SCHED_SLOTS + 8 * t; };
    auto sched_free = [&](int t) { return sched + 24 * Tile::SCHED_SLOTS + 8 * t; };

    const int tid = threadIdx.x, warpgroup = tid / 128;

    // ---- the tiles: (row block, head, batch), persistent -------------------------------------
    // At most one thread block per SM (cuflash/_registry.py, sm90_forward_grid). The work is
    // cut into units of p.per_unit tiles: one tile, or with the causal mask and more tiles
    // than blocks two, row blocks T_r - 1 - r and r of one (head, batch) pair, whose lengths
    // add up to the same for every r; block x takes units x, x + gridDim.x, ..., so that
    // the blocks' shares even out (a causal tile's length grows with its row block).
    // The units go (head, batch) pair by pair, a pair's row blocks one after the other, so
    // that the blocks running at once work on few pairs and read the same K and V at about
    // the same time (from L2: each is read from HBM about once); causal, the longest first.
    const int T_r = (p.seqlen_q + B_r - 1) / B_r, pairs = p.nheads * p.batch;
    const int per = p.per_unit, unit_rows = (T_r + per - 1) / per, units = unit_rows * pairs;
    // (the walk's divisions by the units of a pair and the heads, once per tile: FastDiv,
    // common.cuh, with the host's multipliers, _registry.sm90_forward_walk)
    const FastDiv by_unit_rows{unit_rows, p.unit_rows_mul, p.unit_rows_shift},
        by_heads{p.nheads, p.heads_mul, p.heads_shift};
    struct Tile_ {
        int row_block, head, batch;
    };
    // The split tail's part of the tile (below): column blocks [kb, ke), and where the tile
    // is split between two thread blocks, 2 x the boundary + which part (0, 1), else -1.
    struct TailPart {
        int kb, ke, part;
    };
    TailPart tail{0, 1 << 30, -1};  // (SPLIT_TAIL only; next_tile sets it with tl)
    // The split tail (SPLIT_TAIL: dense batches without a causal mask or a window, where every
    // tile has the same T_c column blocks, and without the score hook). T tiles on G thread
    // blocks take ceil(T / G) rounds of tiles, so that where T is not a multiple of G, G - T % G
    // blocks idle through the last one (at d 128, 16k tokens and 16 heads: 2048 tiles on 132
    // SMs, 15.5 tiles of work in 16 rounds, 3% of the time). So the last p.tail_tiles tiles
    // (at least G and fewer than 2 G, leaving a multiple of G before them) are cut by column
    // blocks instead: their tail_tiles x T_c column blocks, in tile order, go to the G blocks
    // in G even, contiguous shares of at least T_c each (the "stream-K" split of GEMM
    // libraries). A share's first and last tiles may be parts, each split tile cut in two at
    // the boundary between two shares; the parts' O_i and L_i are merged through L_i by
    // whichever finishes last (after the tiles, below).
    // (Not with the score hook: the d 128 hooked tile of 128 x 176 spilled 16 bytes with it.)
    constexpr bool SPLIT_TAIL =
        !SeqT::PACKED && !MaskT::CAUSAL && !MaskT::LOCAL && !ScoreT::REWRITES;
    // Packed batches (variable length) take their tiles in turn instead: the entries' row
    // blocks differ in number and length, and a static split left the blocks' shares 1.1-1.3x
    // apart on a realistic mix of lengths. A scheduler thread (thread 64, in the producer
    // warpgroup) draws the next unit number from a counter (p.tile_counter, zero at launch;
    // a block's first unit is its index), finds its tile (PackedUnits: the entries' row
    // blocks without gaps, causal the longest first) and writes it to a ring of SCHED_SLOTS
    // slots in shared memory, where the producers and the consumers read it in turn (a slot
    // is rewritten once all have: one arrival per producer thread and per consumer warp).
    auto schedule_packed_tiles = [&]() {
        PackedUnits<B_r> walk;
        for (int c = 0;; ++c) {
            const int t = c % Tile::SCHED_SLOTS;
            mbar_wait(sched_free(t), ((c / Tile::SCHED_SLOTS) & 1) ^ 1);
            const int u = c == 0 ? blockIdx.x : gridDim.x + atomicAdd(p.tile_counter, 1);
            int head, block;
            const bool found = walk.find(p, u, head, block);
            st_shared_v4(sched_tile(t),
                         found ? make_int4(MaskT::CAUSAL ? walk.T_r - 1 - block : block, head,
                                           walk.entry, 0)
                               : make_int4(-1, 0, 0, 0));  // (the end)
            mbar_arrive(sched_full(t));
            if (!found) return;
        }
    };
    auto next_packed_tile = [&](int& c, Tile_& tl) {
        const int t = c % Tile::SCHED_SLOTS;
        mbar_wait(sched_full(t), (c / Tile::SCHED_SLOTS) & 1);
        const int4 got = ld_shared_v4_s32(sched_tile(t));
        if (tid >= 128) __syncwarp();  // (a consumer warp: every lane has read it)
        if (tid % 32 == 0) mbar_arrive(sched_free(t));
        ++c;
        tl = Tile_{got.x, got.y, got.z};
        return got.x >= 0;
    };
    // The split tail's geometry: T_c column blocks a tile; share b's first step (of
    // tail_tiles T_c steps over G shares, steps / G each, the first steps % G one more; the
    // host keeps tail_tiles T_c below 2^31); tile t of the tail.
    auto tail_T_c = [&]() { return (p.seqlen_k + B_c - 1) / B_c; };
    auto tail_share = [&](int b) {
        const int steps = p.tail_tiles * tail_T_c(), G = gridDim.x;
        return b * (steps / G) + min(b, steps % G);
    };
    auto tail_tile = [&](int t) {
        const int u = units - p.tail_tiles + t, x = u / unit_rows;
        return Tile_{u % unit_rows, x % p.nheads, x / p.nheads};
    };
    // The causal tail (CAUSAL_TAIL: dense batches under the causal mask alone). A causal
    // unit's two tiles add up to the same length for every unit, so where the units do not
    // fill whole rounds of the G blocks, G - units % G blocks idle through the last one (3%
    // of the time at every causal point of the standard grid). So the last p.tail_tiles
    // units (G + units % G, leaving whole rounds before them) are handed out as single tiles
    // instead: row block by row block from the last (the longest: under the causal mask a
    // row block sees no fewer column blocks than the one above it), in rounds of G tiles, one
    // per block, every other round in reverse (a block that took one of a round's longest
    // takes one of the next round's shortest). The tail's tiles: pair x0's rows rr0 ..
    // T_r - 1 - rr0 (the units of its first tail unit rr0 on) and every row of the pairs
    // after it; in row order, r = T_r - 1 down to 0, each row's pairs in order. (The host,
    // _registry.sm90_forward_grid, sends a tail only with units of two tiles, p.per_unit = 2,
    // and whole rounds of units before it.)
    constexpr bool CAUSAL_TAIL = !SeqT::PACKED && MaskT::CAUSAL && !MaskT::LOCAL;
    auto causal_tail_tile = [&](int k, Tile_& tl) {  // this block's tile k of the tail
        const int G = gridDim.x, body = units - p.tail_tiles;  // (units before the tail)
        const int x0 = body / unit_rows, rr0 = body % unit_rows, whole = pairs - 1 - x0;
        // rows above pair x0's (whole pairs each), its rows (whole + 1), rows below (whole)
        const int n1 = rr0 * whole, n2 = (T_r - 2 * rr0) * (whole + 1);
        const int t = k * G + (k % 2 ? G - 1 - (int)blockIdx.x : (int)blockIdx.x);
        if (t >= 2 * n1 + n2) return false;
        int r, x;
        if (t < n1) {
            r = T_r - 1 - t / whole, x = x0 + 1 + t % whole;
        } else if (t < n1 + n2) {
            r = T_r - 1 - rr0 - (t - n1) / (whole + 1), x = x0 + (t - n1) % (whole + 1);
        } else {
            r = rr0 - 1 - (t - n1 - n2) / whole, x = x0 + 1 + (t - n1 - n2) % whole;
        }
        tl = Tile_{r, x % p.nheads, x / p.nheads};
        return true;
    };
    // This block's tile number c onwards: the next tile into tl and c past it; false at the
    // end. (The producer threads and the consumers walk the same sequence.)
    auto next_tile = [&](int& c, Tile_& tl) {
        if constexpr (SeqT::PACKED) {
            return next_packed_tile(c, tl);
        } else {
            if constexpr (SPLIT_TAIL) {
                tail = TailPart{0, 1 << 30, -1};
                if (p.tail_tiles > 0 && c >= (units - p.tail_tiles) / (int)gridDim.x) {
                    const int b = blockIdx.x, T_c = tail_T_c();
                    const int lo = tail_share(b), hi = tail_share(b + 1);  // steps [lo, hi)
                    // the tail's tile t: the block's (c - whole tiles per block)-th of its share
                    const int t = lo / T_c + c - (units - p.tail_tiles) / (int)gridDim.x;
                    const int first = max(lo, t * T_c), last = min(hi, (t + 1) * T_c);
                    if (first >= last) return false;
                    // split: this part starts inside the tile (the second part of the tile
                    // split at this block's boundary b) or ends inside it (the first part of
                    // the one split at b + 1)
                    const bool starts_in = first > t * T_c, ends_in = last < (t + 1) * T_c;
                    tl = tail_tile(t);
                    tail = TailPart{first - t * T_c, last - t * T_c,
                                    starts_in ? 2 * b + 1 : ends_in ? 2 * (b + 1) : -1};
                    ++c;
                    return true;
                }
            }
            for (;; ++c) {
                if (CAUSAL_TAIL && p.tail_tiles > 0) {  // (per = 2; whole rounds before it)
                    const int first = (units - p.tail_tiles) / (int)gridDim.x * 2;
                    if (c >= first) return causal_tail_tile(c++ - first, tl);
                }
                const int u = blockIdx.x + c / per * gridDim.x, half = c % per;
                if (u >= units) return false;
                const int x = by_unit_rows.div(u), rr = u - x * unit_rows;  // the pair, its unit
                int r = MaskT::CAUSAL ? T_r - 1 - rr : rr;         // (one tile per unit)
                if (per == 2) {                                    // T_r - 1 - rr, then rr
                    if (half == 1 && rr == T_r - 1 - rr) continue;  // (the middle row: once)
                    r = half ? rr : T_r - 1 - rr;
                }
                const int batch = by_heads.div(x);
                tl = Tile_{r, x - batch * p.nheads, batch};
                ++c;
                return true;
            }
        }
    };

    // The column blocks a tile visits (block_range.cuh), or its part's in the split tail.
    auto tile_blocks = [&](const MaskT& mask, const Tile_& tl) {  // (tail: next_tile's)
        ColumnBlocks cb = column_blocks<B_r, B_c>(mask, tl.row_block);
        if constexpr (SPLIT_TAIL) {
            cb.begin = max(cb.begin, tail.kb);
            cb.end = min(cb.end, tail.ke);
        }
        return cb;
    };

    // The split tail's parts in p.tail_parts: part 2 b + 0 and 2 b + 1 of the tile split at
    // boundary b (the first and the second share's), each B_r rows of O (HD float32 each) and
    // B_r of L.
    auto tail_part_o = [&](int part) { return p.tail_parts + size_t(part) * B_r * (HD + 1); };
    auto tail_part_lse = [&](int part) { return tail_part_o(part) + B_r * HD; };
    // Rows first .. first + 15 of the tile (row r of the tile is query row row0 + r) from
    // parts `pair` and `pair` + 1 into O (`o_rows`: row 0 of this head) and L (`lse`), four
    // columns a lane at a time. The loads are unconditional (a part holds every row and
    // column), four iterations in flight at a time (eight spilled the d 128 tile of 128 x
    // 176): one at a time, the merge's L2 latency at the end of the kernel cost d 128 n 512
    // 13% (session 20).
    auto merge_tail_rows = [&](int pair, int first, int row0, int seqlen_q, elem_t* o_rows,
                               float* lse, int lane) {
        const float *o1 = tail_part_o(pair), *o2 = tail_part_o(pair + 1);
        const float *l1 = tail_part_lse(pair), *l2 = tail_part_lse(pair + 1);
        constexpr int VECS = HD / 4;  // float4 per row
#pragma unroll 4
        for (int k = 0; k < 16 * VECS / 32; ++k) {
            const int i = k * 32 + lane;
            const int r = first + i / VECS, col = (i % VECS) * 4, row = row0 + r;
            const float a = __ldcg(l1 + r), b = __ldcg(l2 + r);
            const float4 x = __ldcg(reinterpret_cast<const float4*>(o1 + r * HD + col));
            const float4 y = __ldcg(reinterpret_cast<const float4*>(o2 + r * HD + col));
            const float big = fmaxf(a, b);
            // (both -inf: a row with no key, O = 0, L = -inf)
            const float base = big == CUFLASH_NEG_INF ? 0.f : big;
            const float wa = __expf(a - base), wb = __expf(b - base), sum = wa + wb;
            const float inv = sum == 0.f ? 0.f : 1.f / sum;
            const float fa = wa * inv, fb = wb * inv;
            if (row < seqlen_q && col < p.d) {
                *reinterpret_cast<uint2*>(o_rows + row * p.o_stride_s + col) =
                    make_uint2(T::pack(fa * x.x + fb * y.x, fa * x.y + fb * y.y),
                               T::pack(fa * x.z + fb * y.z, fa * x.w + fb * y.w));
                if (col == 0) lse[row] = sum == 0.f ? CUFLASH_NEG_INF : base + __logf(sum);
            }
        }
    };

    if (tid == 0) {
        for (int c = 0; c < Tile::CONSUMERS; ++c) {
            mbar_init(q_full(c), 1);
            mbar_init(q_free(c), 4);  // one arrival per warp of consumer c
        }
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(k_full(s), 1);
            mbar_init(v_full(s), 1);
            mbar_init(k_free(s), 4 * Tile::CONSUMERS);
            mbar_init(v_free(s), 4 * Tile::CONSUMERS);
        }
        if constexpr (SeqT::PACKED) {  // the tile ring
            for (int t = 0; t < Tile::SCHED_SLOTS; ++t) {
                mbar_init(sched_full(t), 1);
                mbar_init(sched_free(t), 2 + 4 * Tile::CONSUMERS);
            }
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warpgroup == 0) {
        // ---- producer: TMA loads ------------------------------------------------------
        regs_decrease<Tile::PRODUCER_REGS>();
        // Two issuing threads, one for K (and Q_i) and one for V, so that a K load never
        // waits behind a V slot that P~V still reads. Slots are counted over all the block's
        // tiles (`it`): K_j (or V_j) goes to slot it % STAGES once the consumers have freed
        // its previous round.
        if constexpr (SeqT::PACKED) {
            if (tid == 64) schedule_packed_tiles();
        }
        if (tid != 0 && tid != 32) return;
        const bool is_k = tid == 0;
        const TensorMap* map = is_k ? &p.tm_k : &p.tm_v;
        int it = 0, c = 0;
        Tile_ tl;
        for (int count = 0; next_tile(c, tl); ++count) {
            const SeqInfo seq = SeqT::info(p, tl.batch);
            const MaskT mask(p, seq.seqlen_q, seq.seqlen_k);
            const ColumnBlocks cb = tile_blocks(mask, tl);
            const int head_k = tl.head / p.group;
            // Q_i, consumer w's 64 rows: GROUPS boxes of 64 columns x 64 rows, once consumer w
            // has read its last ones, so that consumer 0's load as soon as its last S of the
            // tile before is done (a turn before the others'), for its first S here, which
            // comes first. The K thread loads consumer 0's, the V thread the others' (their
            // slots free at about the same time as its next V slot), so that the K loads do
            // not wait behind them for the last consumer's last S.
            auto load_q = [&](int w) {
                mbar_wait(q_free(w), (count & 1) ^ 1);
                mbar_arrive_expect_tx(q_full(w), Tile::Q_BYTES / Tile::CONSUMERS);
                for (int g = 0; g < GROUPS; ++g)
                    tma_load_4d(sQ + g * (B_r * 128) + w * (64 * 128), &p.tm_q, q_full(w), g * 64,
                                seq.q_row0() + tl.row_block * B_r + 64 * w, tl.head,
                                seq.q_batch());
            };
            if (is_k)
                load_q(0);
            else
                for (int w = 1; w < Tile::CONSUMERS; ++w) load_q(w);
            for (int j = cb.begin; j < cb.end; ++j, ++it) {
                const int stage = it % STAGES;
                const unsigned full = is_k ? k_full(stage) : v_full(stage);
                mbar_wait(is_k ? k_free(stage) : v_free(stage), ((it / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(full, Tile::KV_BYTES);
                const unsigned dst = is_k ? sK(stage) : sV(stage);
                for (int g = 0; g < GROUPS; ++g)
                    tma_load_4d(dst + g * (B_c * 128), map, full, g * 64,
                                seq.k_row0() + j * B_c, head_k, seq.k_batch());
            }
        }
        return;
    }

    // ---- consumers ----------------------------------------------------------------------
    regs_increase<Tile::CONSUMER_REGS>();
    // which 64 rows of Q_i: 64 wg .. (shuffled from lane 0: warp-uniform to the compiler, as
    // CUTLASS takes its warp-group index; as warpgroup - 1, with Q_i's barriers per consumer,
    // the d 128 and three-consumer tiles spilled 4-60 bytes: compile check)
    const int wg = __shfl_sync(~0u, warpgroup - 1, 0);
    const int warp = (tid / 32) % 4, lane = tid % 32;
    // This consumer's 64 rows of Q_i: group g at sQ + g * B_r rows * 128 bytes + 64 wg rows.
    const unsigned q_rows = sQ + wg * 64 * 128;

    // S_ij = Q_i K_j^T for the block in slot round `it` (counted over the block's tiles),
    // issued (not awaited): HD / 16 k-steps of m64 n B_c k16; step kk reads 16 head-dim
    // columns: group kk / 4, byte offset 32 (kk % 4) within the 128-byte rows.
    auto issue_s = [&](float (&s)[1][NT_S][4], int it) {
        const int stage = it % STAGES;
        mbar_wait(k_full(stage), (it / STAGES) & 1);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
            const unsigned off = (kk % 4) * 32;
            Wgmma<T, B_c>::ss(s[0], smem_desc(q_rows + (kk / 4) * (B_r * 128) + off, 0, 1024),
                              smem_desc(sK(stage) + (kk / 4) * (B_c * 128) + off, 0, 1024),
                              kk > 0);
        }
        wgmma_commit();
    };
    // O~_i += P~_ij V_j for the block in slot round `it`, issued and committed (not awaited):
    // B_c / 16 k-steps of m64 n HD k16, P~ from registers, V_j N-major: k-step kk starts 16 kk
    // rows down, 64-column groups B_c rows apart.
    float o[1][NT_O][4];  // O~_i, unscaled (this warp's 16 rows of the consumer's 64)
    auto issue_pv = [&](const unsigned (&pa)[B_c / 16][4], int it) {
        const int stage = it % STAGES;
        mbar_wait(v_full(stage), (it / STAGES) & 1);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < B_c / 16; ++kk)
            Wgmma<T, HD>::rs(o[0], pa[kk], smem_desc(sV(stage) + kk * 16 * 128, B_c * 128, 1024),
                             1);
        wgmma_commit();
    };
    // One arrival per warp on a "read" barrier.
    auto release = [&](unsigned bar) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };

    // With HANDOVER, PINGPONG's turns (below) run on across tiles: consumer 0 has the first;
    // once the last consumer has issued its last P~V of a tile, it hands consumer 0 the first
    // turn of the next tile that has steps (tiles with none take no turn), so that consumer
    // 0's S there runs under the others' epilogue instead of after it (a short tile is a few
    // steps: causal n 512 at d 64 is one to four). One hand-over is outstanding at most (the
    // next comes only after consumer 0 has taken a turn); consumer 0 takes the last one,
    // which no tile uses, at the end.
    constexpr int LAST = Tile::CONSUMERS - 1;
    if (Tile::HANDOVER && wg == LAST) named_barrier_arrive(1, 256);
    int it0 = 0, c = 0;  // slot rounds before this tile, the walk's position
    Tile_ tl;
    for (int count = 0; next_tile(c, tl); ++count) {  // (count: tiles done)
        const int head = tl.head, nheads = p.nheads;
        const SeqInfo seq = SeqT::info(p, tl.batch);
        const int seqlen_q = seq.seqlen_q;
        const MaskT mask(p, seqlen_q, seq.seqlen_k);
        const Score score(p, tl.batch, head);  // (this tile's head)
        const int row0 = tl.row_block * B_r;
        const ColumnBlocks cb = tile_blocks(mask, tl);
        const int n = cb.end - cb.begin;  // column blocks visited
        const int row_lane = row0 + 64 * wg + 16 * warp + lane / 4;  // + 8 e2: this lane's rows

        zero(o);
        OnlineSoftmax<1, NT_S, NT_O, false, Tile::LAZY_RESCALE, Tile::RESCALE_LOG2,
                      Tile::POLY_EVERY>
            softmax;
        mbar_wait(q_full(wg), count & 1);

        // Mask, online softmax and P~ for block j, S_ij in s (awaited): P~_ij packed into pa,
        // the A fragments of P~V (the S accumulators of n8 tiles 2 kk, 2 kk + 1 are the A
        // fragment of k-step kk). Needs the previous P~V done (it rescales O~_i).
        auto softmax_step = [&](float (&s)[1][NT_S][4], int j, unsigned (&pa)[B_c / 16][4]) {
            const int col0 = j * B_c;
            // The score hook (score.cuh): S_ij as the softmax sees it (nothing to do for the
            // scale alone, which the softmax folds into its exponent).
            // ALiBi's part per row and lane is left out of S where the block lies on one side
            // of the diagonal, in row_bias, for the softmax to add back (0 elsewhere); outside
            // the causal mask at d 64 only (score.cuh).
            constexpr bool ROW_BIAS = Score::template has_row_bias<HD, MaskT>();
            float row_bias[1][2];
            if constexpr (Score::REWRITES) {
                // (the diagonal distance at this lane's first column, its two rows: score.cuh)
                // (dense: the lengths straight from the parameters, which ptxas reloads
                // instead of keeping: the d 128 window + hook tile spilled otherwise)
                float dist[2];
#pragma unroll
                for (int e2 = 0; e2 < 2; ++e2)
                    dist[e2] = score.template diagonal<shifted_diagonal<SeqT, MaskT>()>(
                        p, row_lane + e2 * 8, col0 + (lane % 4) * 2,
                        SeqT::PACKED ? seqlen_q : p.seqlen_q,
                        SeqT::PACKED ? seq.seqlen_k : p.seqlen_k);
                score.template apply_fragment<HD, MaskT>(p, s[0], dist, row_bias[0]);
            }
            // Mask (mask.cuh), on blocks that cross a mask limit or the end of K
            // (block_range.cuh): S_ij[r, c] = -inf where key c is not visible from query r.
            // (the hooked tiles test each row on its own: mask.cuh, SHARED)
            if (j >= cb.masked_begin || (MaskT::LOCAL && j < cb.unmasked_begin))
                mask_fragment<!Score::REWRITES>(mask, s[0], row_lane, col0, lane);
            // Online softmax (softmax.cuh): P~_ij in place of S_ij, l_i and O~_i rescaled.
            softmax.template update<ROW_BIAS>(s, o, score.exp2_scale, lane, row_bias);
#pragma unroll
            for (int kk = 0; kk < B_c / 16; ++kk) pack_a_fragment<T>(pa[kk], s[0], kk);
        };

        // ---- the FA2 inner loop, on wgmma: one step per column block j --------------------
        // In one of three schedules: ping-pong between the consumers (PINGPONG), or each
        // consumer on its own, with or without the intra-warpgroup overlap (OVERLAP).
        if constexpr (Tile::PINGPONG) {
            // The consumers take turns on the tensor cores, in order 0, 1, (2,) 0, ...: in its
            // turn a consumer issues P~V of its previous block and S of its next, then hands
            // the turn to the next and runs its softmax while the others' matmuls run
            // (FlashAttention-3's inter-warpgroup overlap). Turns are named barriers: consumer
            // w waits on barrier 1 + w (256 threads: its own 128 and the previous one's
            // arrival); per tile, consumer 0 goes first, the last one handing it the turn
            // (with HANDOVER, the first step's at the end of the last earlier tile with steps,
            // or before the tiles' loop: see there; without, here).
            // the next one's barrier (1 + (wg + 1) % CONSUMERS in general; 2 - wg, its value
            // for two, kept spelled out: the general form changed the two-warpgroup SASS)
            const int next_turn =
                Tile::CONSUMERS == 2 ? 2 - wg : 1 + (wg + 1) % Tile::CONSUMERS;
            unsigned pa[B_c / 16][4];
            float s[1][NT_S][4];
            if (!Tile::HANDOVER && wg == LAST && n > 0) named_barrier_arrive(1, 256);
            for (int i = 0; i < n; ++i) {
                named_barrier_sync(1 + wg, 256);
                if (i > 0) issue_pv(pa, it0 + i - 1);
                issue_s(s, it0 + i);
                if (!(wg == LAST && i == n - 1)) named_barrier_arrive(next_turn, 256);
                wgmma_wait<0>();
                fence_accumulators(s[0]);
                fence_accumulators(o[0]);
                release(k_free((it0 + i) % STAGES));  // S_ij is done: K_j is read
                if (i > 0) release(v_free((it0 + i - 1) % STAGES));  // and the last P~V
                // The tile's last S is done: this consumer's rows of Q_i may be replaced, and
                // the next tile's load under this one's last softmax, P~V and epilogue.
                if (i == n - 1) release(q_free(wg));
                softmax_step(s, cb.begin + i, pa);
            }
            if (n > 0) {
                issue_pv(pa, it0 + n - 1);
                // (the first turn of the next tile with steps: the last consumer's matmuls
                // of this tile are issued, see above the tiles' loop)
                if (Tile::HANDOVER && wg == LAST) named_barrier_arrive(1, 256);
            }
        } else {
            // Step i works on S_ij in `s` and, with OVERLAP, first issues S for the next
            // block into `s_next`, so that the tensor cores compute it while this step's
            // softmax runs (FlashAttention-3's intra-warpgroup overlap).
            auto step = [&](float (&s)[1][NT_S][4], float (&s_next)[1][NT_S][4], int i) {
                const int it = it0 + i, stage = it % STAGES;
                const bool has_next = Tile::OVERLAP && i + 1 < n;
                if (!Tile::OVERLAP) issue_s(s, it);  // (no overlap: S_ij now, one S buffer)
                if (has_next) issue_s(s_next, it + 1);
                // In flight: S_ij and the previous P~V (older), the next S (newest).
                if (has_next)
                    wgmma_wait<1>();
                else
                    wgmma_wait<0>();
                fence_accumulators(s[0]);
                fence_accumulators(o[0]);
                if (Tile::OVERLAP) {  // S_ij is done, and the previous step's P~V
                    release(k_free(stage));
                    if (i > 0) release(v_free((it - 1) % STAGES));
                }
                unsigned pa[B_c / 16][4];
                softmax_step(s, cb.begin + i, pa);
                issue_pv(pa, it);
                if (!Tile::OVERLAP) {  // P~V awaited here; K_j and V_j are read
                    wgmma_wait<0>();
                    fence_accumulators(o[0]);
                    release(k_free(stage));
                    release(v_free(stage));
                }
            };
            float s_a[1][NT_S][4];
            if constexpr (Tile::OVERLAP) {
                float s_b[1][NT_S][4];
                if (n > 0) issue_s(s_a, it0);
                for (int i = 0; i < n; i += 2) {
                    step(s_a, s_b, i);
                    if (i + 1 < n) step(s_b, s_a, i + 1);
                }
                // (OVERLAP frees V of a step in the next one: the tile's last V here)
                if (n > 0) {
                    wgmma_wait<0>();
                    release(v_free((it0 + n - 1) % STAGES));
                }
            } else {
                for (int i = 0; i < n; ++i) step(s_a, s_a, i);
            }
        }
        wgmma_wait<0>();
        fence_accumulators(o[0]);
        if (!Tile::PINGPONG || n == 0) release(q_free(wg));  // every S of the tile is done
        if constexpr (Tile::PINGPONG) {  // (ping-pong frees V of a step in the next one)
            if (n > 0) release(v_free((it0 + n - 1) % STAGES));
        }
        it0 += n;

        // ---- epilogue: O_i = diag(l_i)^-1 O~_i, L_i = m_i + log(l_i) -----------------------
        // O in 16-byte stores (common.cuh, store_accumulator_row: 4-byte stores of column pairs
        // took ~3900 cycles a tile). O starts on a 16-byte boundary with strides that are
        // multiples of 8 elements (cuflash/_api.py checks a given out; a new one is contiguous).
        // A part of a tile of the split tail ("the tiles") stores its O_i and L_i in float32
        // to its slot of p.tail_parts instead (tail_part_o, tail_part_lse), for the merge
        // after the tiles.
        // (packed: the entry's offsets loaded afresh through opaque (common.cuh), not kept in
        // registers through the loop, where d 64's B_c 128 tile spilled; dense: seq's)
        const SeqInfo out_seq = SeqT::PACKED ? SeqT::info(p, opaque(tl.batch)) : seq;
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
            const float l_row = softmax.row_sum(0, e2, lane);
            softmax.template normalise<Tile::CONSUMERS == 2>(o, 0, e2, l_row);  // (softmax.cuh)
            const int row = row_lane + 8 * e2;
            if (SPLIT_TAIL && tail.part >= 0) {
                if (lane % 4 == 0)
                    tail_part_lse(tail.part)[row - row0] =
                        softmax.lse(0, e2, l_row, score.lse_scale);
                store_accumulator_row_f32(o[0], e2, tail_part_o(tail.part) + (row - row0) * HD,
                                          lane);
                continue;
            }
            if (lane % 4 == 0 && row < out_seq.seqlen_q)
                p.lse[out_seq.row_vector(head, nheads) + row] =
                    softmax.lse(0, e2, l_row, score.lse_scale);
            store_accumulator_row<T>(o[0], e2,
                                     p.o + out_seq.q_offset(p.o_stride_b, p.o_stride_s) +
                                         row * p.o_stride_s + head * p.o_stride_h,
                                     row < out_seq.seqlen_q, p.d, lane);
        }
    }
    if (Tile::HANDOVER && wg == 0) named_barrier_sync(1, 256);  // (the last hand-over)

    // ---- the split tail: each split tile's two parts merged -----------------------------
    // After its tiles (in the tile loop this code spilled the d 128 tile of 128 x 176), each
    // warp counts itself in at p.tail_flags for each tile split at this block's boundaries,
    // b (whose second part was its first tile) and b + 1 (whose first part was its last).
    // The second of a split tile's two warps to count in merges their 16 rows (the first is
    // done) and sets the count back to 0 for the next launch. No warp waits on another.
    //     L_i = log(e^L'_i + e^L''_i),  O_i = e^(L'_i - L_i) O'_i + e^(L''_i - L_i) O''_i
    if constexpr (SPLIT_TAIL) {
        if (p.tail_tiles > 0) {
            __threadfence();  // (this warp's stores of its parts, before its counts)
            __syncwarp();
            for (int b = blockIdx.x; b <= (int)blockIdx.x + 1; ++b) {
                const int step = tail_share(b), T_c = tail_T_c();
                if (step % T_c == 0) continue;  // (a boundary between whole tiles)
                int* count = p.tail_flags + b * (4 * Tile::CONSUMERS) + wg * 4 + warp;
                if (!count_in_last(count, 2, lane)) continue;  // (the other part merges)
                const Tile_ tt = tail_tile(step / T_c);
                const SeqInfo seq = SeqT::info(p, tt.batch);
                merge_tail_rows(2 * b, 64 * wg + 16 * warp, tt.row_block * B_r, seq.seqlen_q,
                                p.o + seq.q_offset(p.o_stride_b, p.o_stride_s) +
                                    tt.head * p.o_stride_h,
                                p.lse + seq.row_vector(tt.head, p.nheads), lane);
            }
        }
    }
}

}  // namespace cuflash
