// fa2_decode.cu: decoding against a KV cache (split-KV, FlashDecoding), on tensor cores
// (mma.sync m16n8k16, fp32 accumulate), sm_80 and newer. Memory-bound: the work is reading K
// and V once, as fast as HBM gives them.
//
// Algorithm (the FA2 forward's, cuflash/reference.py attention_kvcache_split):
//   one thread block per (split s of the key range, group of query heads, batch entry b).
//   - Query heads packed by KV head: the PACK query heads of a group (all G that share KV head
//     hk, or one where ALiBi gives each head its own bias) are the rows of one tile, row
//     r = g seqlen_q + i holding query head h0 + g at position i, so that K_j and V_j are read
//     once for all of them. (B_r = 16 rows per tile; more rows take more tiles, grid.y.)
//   - The split's column blocks are taken by the NWARPS warps in turn (warp w: blocks
//     begin + w, begin + w + NWARPS, ...), each with its own ring of STAGES K/V buffers and its
//     own online softmax over the tile's 16 rows, the FA2 inner loop:
//         S_ij = Q_i K_j^T,  hook and mask,  m_new = max(m, rowmax S_ij),
//         P~_ij = exp(S_ij - m_new),  l = e^(m - m_new) l + rowsum P~_ij,
//         O~ = diag(e^(m - m_new)) O~ + P~_ij V_j
//   - The warps' (m_w, l_w, O~_w) are combined through shared memory (exact, as the splits):
//         m = max_w m_w,  l = sum_w e^(m_w - m) l_w,  O~ = sum_w e^(m_w - m) O~_w,
//     and the block writes O = diag(l)^-1 O~, L = m + log l: into O and L when there is one
//     split, else into the float32 partials O_s, L_s that fa2_decode_combine merges:
//         L = log sum_s e^(L_s),  O = sum_s e^(L_s - L) O_s.
// K and V rows come from a contiguous cache (batch, capacity, heads_k, d) or a paged one
// (num_pages, page_size, heads_k, d): key j of entry b is row j % page_size of page
// block_table[b, j / page_size]. Entry b sees its first cache_seqlens[b] + seqlen_new keys
// (the new keys, fa2_decode_append, are written into the cache first); masks are aligned
// bottom-right on that length (mask.cuh), the queries being the last seqlen_q positions.
//
// Variants (template parameters; cuflash/_plan.py picks them):
//   T       fp16 | bf16
//   Tile = DecodeTile<HD, B_c, NWARPS, STAGES>: head-dim bucket (d a multiple of 8, <= HD),
//          keys per column block, warps, K/V buffers per warp
//   MaskT = Mask<CAUSAL, LOCAL>    which keys each row sees (mask.cuh)
//   ScoreT = ScoreScale | ScoreHook  the score hook (score.cuh): softcap and ALiBi
#include "common.cuh"
#include "params.cuh"
#include "mask.cuh"
#include "score.cuh"
#include "softmax.cuh"

namespace cuflash {

template <int HD_, int B_c_, int NWARPS_, int STAGES_>
struct DecodeTile {
    static constexpr int HD = HD_, B_c = B_c_, NWARPS = NWARPS_, STAGES = STAGES_;
    static constexpr int B_r = 16;                  // packed query rows per tile: one m16 tile
    static constexpr int NTHREADS = NWARPS * 32;
    static constexpr int NT_S = B_c / 8;            // n8 tiles across S_ij
    static constexpr int NT_O = HD / 8;             // n8 tiles across O~
    static constexpr int KS_QK = HD / 16;           // k16 steps of Q K_j^T
    static constexpr int KS_PV = B_c / 16;          // k16 steps of P~ V_j
    static constexpr int KV_ELEMS = B_c * HD;       // one K_j or V_j buffer
    // Shared memory, in bytes: Q (B_r x HD), then per warp STAGES x (K_j, V_j), 16-bit; the
    // warps' combine reuses the K/V area: NWARPS x B_r rows of O~_w (CS floats each: padded,
    // so that the lanes' stores of a fragment's 8 rows fall on distinct banks), m_w and l_w,
    // then two 64-bit offsets per row (where its O and L go).
    static constexpr int CS = HD + 8;
    // (cuflash/_plan.py's DecodeConfig.smem_bytes; the compile check asserts they agree.)
    static constexpr int KV_BYTES = 2 * NWARPS * STAGES * 2 * KV_ELEMS;
    static constexpr int COMBINE_BYTES = 4 * NWARPS * B_r * (CS + 2) + 16 * B_r;
    static constexpr int SMEM_BYTES =
        2 * B_r * HD + (KV_BYTES > COMBINE_BYTES ? KV_BYTES : COMBINE_BYTES);

    static_assert(HD % 32 == 0 && HD <= 256, "head-dim bucket must be a multiple of 32, <= 256");
    static_assert(B_c % 16 == 0, "B_c is a whole number of k16 steps of P V");
    static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 K/V buffers per warp");
};

// The key rows of one batch entry's cache: row j of K (or V) for KV head hk, contiguous or
// through the block table (cuflash/reference.py cache_rows). The attention reads them, the
// append writes them.
struct CacheRows {
    elem_t* base;                  // K or V: entry b (contiguous), head hk
    long long stride_b, stride_s;  // batch (contiguous) or page (paged) stride, row stride
    const int* table;              // paged: this entry's row of the block table; else null
    int page_size;

    // cache: p.k or p.v, with its (batch or page, row, head) strides
    __device__ __forceinline__ CacheRows(const DecodeParams& p, elem_t* cache,
                                         long long stride_b_, long long stride_s_,
                                         long long stride_h, int batch, int head_k)
        : base(cache + (p.block_table ? 0 : batch * stride_b_) + head_k * stride_h),
          stride_b(stride_b_), stride_s(stride_s_),
          table(p.block_table ? p.block_table + batch * p.block_table_stride : nullptr),
          page_size(p.page_size) {}

    __device__ __forceinline__ elem_t* row(int j) const {
        if (table == nullptr) return base + j * stride_s;
        return row_in(table[j / page_size], j);
    }
    // Paged: row j, its page (table[j / page_size]) looked up already.
    __device__ __forceinline__ elem_t* row_in(int page, int j) const {
        return base + page * stride_b + (j % page_size) * stride_s;
    }
};

// The merge of one query row's splits (split-KV), by one warp, lanes over d:
//     L = log sum_s e^(L_s),   O = sum_s e^(L_s - L) O_s
// (a row no split saw: O = 0, L = -inf). rows: batch x heads x seqlen_q, row: (b, h, i)'s
// index among them. Every split writes its O_s and L_s, O_s = 0 and L_s = -inf where it saw
// none of the row's keys (e^(L_s - L) = 0), so the sum needs no branch per split: lane s % 32
// computes split s's weight e^(L_s - L), a shuffle hands it to the warp, and each lane adds
// that split's O_s at its columns c = lane + 32 k. No load waits on another, so the loads of
// several splits are in flight at once. (__ldcg: each partial is read once, no use keeping it
// in L1.)
// (b, h, i): the row's batch entry, head and position (for O's strides).
template <typename T>
__device__ __forceinline__ void merge_splits(const DecodeParams& p, long long rows,
                                             long long row, int b, int h, int i, int lane) {
    constexpr int COLS = 256 / 32;  // columns per lane (d <= 256)
    constexpr float LOG2E = 1.4426950408889634f;  // e^x = 2^(x log2(e))
    const int S = p.num_splits, d = p.d;
    // L = top + log sum_s e^(L_s - top), top = max_s L_s (lanes over s, then the warp). Lane
    // s keeps L_s of the first 32 splits (-inf past S), so that they are loaded once.
    const float L_lane = lane < S ? __ldcg(p.lse_partial + lane * rows + row) : CUFLASH_NEG_INF;
    float top = L_lane;
    for (int s = lane + 32; s < S; s += 32)
        top = fmaxf(top, __ldcg(p.lse_partial + s * rows + row));
#pragma unroll
    for (int off = 16; off > 0; off /= 2) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, off));
    const float top_safe = top == CUFLASH_NEG_INF ? 0.f : top;
    float total = exp2_approx((L_lane - top_safe) * LOG2E);  // (e^-inf = 0)
    for (int s = lane + 32; s < S; s += 32)
        total += exp2_approx((__ldcg(p.lse_partial + s * rows + row) - top_safe) * LOG2E);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
    const float L = total == 0.f ? CUFLASH_NEG_INF : top_safe + logf(total);

    // O = sum_s e^(L_s - L) O_s, 32 splits per round (their weights one per lane)
    float acc[COLS];
#pragma unroll
    for (int k = 0; k < COLS; ++k) acc[k] = 0.f;
    for (int s0 = 0; s0 < S && total != 0.f; s0 += 32) {  // (total: the same on every lane)
        const float L_s = s0 == 0                ? L_lane
                          : s0 + lane < S ? __ldcg(p.lse_partial + (s0 + lane) * rows + row)
                                          : CUFLASH_NEG_INF;
        const float w_lane = exp2_approx((L_s - L) * LOG2E);
        const int n = min(32, S - s0);
#pragma unroll 4
        for (int j = 0; j < n; ++j) {
            const float w = __shfl_sync(0xffffffffu, w_lane, j);
            const float* o_s = p.o_partial + ((s0 + j) * rows + row) * d;
#pragma unroll
            for (int k = 0; k < COLS; ++k)
                if (lane + 32 * k < d) acc[k] = fmaf(w, __ldcg(o_s + lane + 32 * k), acc[k]);
        }
    }
    elem_t* out = p.o + b * p.o_stride_b + i * p.o_stride_s + h * p.o_stride_h;
#pragma unroll
    for (int k = 0; k < COLS; ++k)
        if (lane + 32 * k < d) out[lane + 32 * k] = T::from_float(acc[k]);
    if (lane == 0) p.lse[row] = L;
}

// Q, O: (batch, seqlen_q, heads, d); K, V caches as above; L (batch, heads, seqlen_q) float32.
// (__launch_bounds__: one block per SM is the plan, shared memory allows no more; without the
// 1, ptxas aimed at 168 registers and the d 160 kernels with the hook spilled.)
template <typename T, typename Tile, typename MaskT, typename ScoreT = ScoreScale>
__global__ void __launch_bounds__(Tile::NTHREADS, 1)
fa2_decode(const DecodeParams p) {
    constexpr int HD = Tile::HD, B_r = Tile::B_r, B_c = Tile::B_c, NWARPS = Tile::NWARPS;
    constexpr int STAGES = Tile::STAGES, NT_S = Tile::NT_S, NT_O = Tile::NT_O;
    constexpr int NC = HD / 8;  // 16-byte chunks per tile row

    extern __shared__ __attribute__((aligned(128))) elem_t smem[];
    elem_t* sQ = smem;                    // (B_r, HD) the packed query rows
    elem_t* sKV = sQ + B_r * HD;          // per warp: STAGES x (K_j, V_j), each (B_c, HD)
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    // This block's work: split, query heads h0 .. h0 + pack - 1 (rows of row tile rt), entry b.
    const int split = blockIdx.x, batch = blockIdx.z;
    const int row_tile = blockIdx.y % p.row_tiles, unit = blockIdx.y / p.row_tiles;
    const int h0 = unit * p.pack, head_k = h0 / p.group;
    // (launched as the append's dependent: the cache's new rows are written past this wait;
    // the splits' combine may then start, and waits in turn for this grid to finish)
    grid_dependency_wait();
    launch_dependents();
    const int seqlen_q = p.seqlen_q;
    const int seqlen_k = p.cache_seqlens[batch] + p.seqlen_new;
    const int packed_rows = p.pack * seqlen_q;  // valid rows over all row tiles
    const MaskT mask(p, seqlen_q, seqlen_k);
    const ScoreT score(p, batch, h0);  // (ALiBi: pack = 1, one head per tile)
    const int chunks = p.d / 8;

    // Q: the tile's packed rows, HBM -> shared (cp.async, zero-filled past the rows and d).
    for (int i = tid; i < B_r * NC; i += Tile::NTHREADS) {
        const int r = i / NC, c = i % NC, pr = row_tile * B_r + r;
        const int g = pr / seqlen_q, pos = pr % seqlen_q;
        const bool valid = pr < packed_rows && c < chunks;
        const elem_t* src = p.q + batch * p.q_stride_b + pos * p.q_stride_s +
                            (h0 + g) * p.q_stride_h + c * 8;
        cp_async_16(smem_u32(sQ + tile_offset<HD>(r, c)), valid ? src : p.q, valid);
    }
    cp_async_commit();

    // The split's column blocks (cuflash/reference.py kvcache_splits), cut to the keys some
    // row of the tile sees (positions 0 .. seqlen_q - 1: its rows are all of them, per head).
    const int T_c = (seqlen_k + B_c - 1) / B_c;
    const int per = max(1, (T_c + p.num_splits - 1) / p.num_splits);
    int begin = min(split * per, T_c), end = min(begin + per, T_c);
    {
        const KeyRange first = mask.keys(0), last = mask.keys(seqlen_q - 1);
        if (MaskT::LOCAL) begin = max(begin, max(first.lo, 0) / B_c);
        end = last.hi < 0 ? begin : min(end, last.hi / B_c + 1);
        end = max(begin, end);
    }
    // This warp's blocks: begin + warp + t NWARPS, t < mine.
    const int mine = end - begin > warp ? (end - begin - warp + NWARPS - 1) / NWARPS : 0;

    const CacheRows rows_k(p, p.k, p.k_stride_b, p.k_stride_s, p.k_stride_h, batch, head_k);
    const CacheRows rows_v(p, p.v, p.v_stride_b, p.v_stride_s, p.v_stride_h, batch, head_k);
    elem_t* my_kv = sKV + warp * STAGES * 2 * Tile::KV_ELEMS;
    // K_j, V_j of this warp's t-th block: HBM -> buffer t % STAGES (cp.async by this warp's
    // lanes, zero-filled past the entry's keys and past d; the caller commits). In segments of
    // SEG keys: a segment is a run of rows at one stride (a contiguous cache, or a page that
    // holds whole segments: page_size % SEG == 0, as vLLM's 16 and up), so one row address
    // per segment, then load_tile_async's bumped pointers and immediate offsets. Other page
    // sizes, and head-dim buckets whose rows the warp does not cover in whole rows per copy
    // (96, 160, 192, 224: 32 % (HD / 8) != 0; the unrolled segments spill there), go row by
    // row through the block table, an address per 16-byte copy.
    // Paged, by segment: in the main loop each warp loads the pages of the block it will copy
    // at the next step while it issues this step's copies (fetch_pages(t + STAGES) after
    // load_kv(t + STAGES - 1)), so those copies do not wait on their block-table loads; the
    // prologue's blocks look theirs up just before.
    constexpr int SEG = 16, SEGS = B_c / SEG;
    const bool by_segment =
        (32 % NC == 0) && (rows_k.table == nullptr || p.page_size % SEG == 0);
    const bool prefetch_pages = by_segment && rows_k.table != nullptr;
    int pages[SEGS];  // the pages of the segments of the block load_kv copies next
    auto fetch_pages = [&](int t) {
        const int col0 = (begin + warp + t * NWARPS) * B_c;
#pragma unroll
        for (int sg = 0; sg < SEGS; ++sg) {
            const int key0 = col0 + sg * SEG;
            pages[sg] = prefetch_pages && t < mine && key0 < seqlen_k
                            ? rows_k.table[key0 / p.page_size] : 0;
        }
    };
    auto load_kv = [&](int t) {
        const int col0 = (begin + warp + t * NWARPS) * B_c;
        elem_t* sk = my_kv + (t % STAGES) * 2 * Tile::KV_ELEMS;
        elem_t* sv = sk + Tile::KV_ELEMS;
        if constexpr (32 % NC == 0) {
            if (by_segment) {
#pragma unroll
                for (int sg = 0; sg < SEGS; ++sg) {
                    const int key0 = col0 + sg * SEG, rows_valid = seqlen_k - key0;
                    const bool any = rows_valid > 0;
                    load_tile_async<SEG, HD, 32, false>(
                        sk + sg * SEG * HD, !any ? p.k : prefetch_pages
                            ? rows_k.row_in(pages[sg], key0) : rows_k.row(key0),
                        rows_k.stride_s, rows_valid, chunks, lane);
                    load_tile_async<SEG, HD, 32, false>(
                        sv + sg * SEG * HD, !any ? p.v : prefetch_pages
                            ? rows_v.row_in(pages[sg], key0) : rows_v.row(key0),
                        rows_v.stride_s, rows_valid, chunks, lane);
                }
                return;
            }
        }
#pragma unroll 4
        for (int i = lane; i < B_c * NC; i += 32) {
            const int r = i / NC, c = i % NC, key = col0 + r;
            const bool valid = key < seqlen_k && c < chunks;
            const int off = tile_offset<HD>(r, c);
            cp_async_16(smem_u32(sk + off), valid ? rows_k.row(key) + c * 8 : p.k, valid);
            cp_async_16(smem_u32(sv + off), valid ? rows_v.row(key) + c * 8 : p.v, valid);
        }
    };
    // The first STAGES - 1 blocks in flight (one cp.async group each, empty past `mine`).
    // (Not unrolled: one copy of load_kv's code here instead of STAGES - 1. The kernel is
    // short, and at batch 1 x 1k keys instruction fetch was 38% of its stalls under ncu.)
#pragma unroll 1
    for (int t = 0; t < STAGES - 1; ++t) {
        fetch_pages(t);
        if (t < mine) load_kv(t);
        cp_async_commit();
    }
    fetch_pages(STAGES - 1);
    cp_async_wait<STAGES - 1>();  // Q (the oldest group)
    __syncthreads();              // ... every thread's rows of it

    // Each lane's two rows of the tile (e2 = 0, 1: lane / 4 and + 8), as query positions.
    int pos[2];
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) pos[e2] = (row_tile * B_r + lane / 4 + e2 * 8) % seqlen_q;

    float o[1][NT_O][4];  // O~_w, unscaled
    zero(o);
    OnlineSoftmax<1, NT_S, NT_O, false, false> softmax;
    const SwizzledReader<HD> readQ(smem_u32(sQ), lane_row_rows_first(lane),
                                   lane_chunk_rows_first(lane));

    // ---- the FA2 inner loop, one step per column block of this warp ------------------------
    for (int t = 0; t < mine; ++t) {
        cp_async_wait<STAGES - 2>();  // block t in shared memory (this lane's copies) ...
        __syncwarp();                 // ... and every lane's; all done with block t - 1
        if (t + STAGES - 1 < mine) load_kv(t + STAGES - 1);  // into block t - 1's buffers
        cp_async_commit();
        fetch_pages(t + STAGES);  // (consumed next step)
        const int col0 = (begin + warp + t * NWARPS) * B_c;
        const elem_t* sk = my_kv + (t % STAGES) * 2 * Tile::KV_ELEMS;
        const elem_t* sv = sk + Tile::KV_ELEMS;

        // S_ij = Q_i K_j^T (16 x B_c): A = the packed query rows, B = K_j rows.
        float s[1][NT_S][4];
        zero(s);
        const SwizzledReader<HD> readK(smem_u32(sk), lane_row_chunks_first(lane),
                                       lane_chunk_chunks_first(lane));
        warp_mma<T, Tile::KS_QK, false>(
            s,
            [&](unsigned (&a)[4], int, int kk, int g) {
                ldmatrix_x4(a, readQ.at(0, kk * 2) + g * 128);
            },
            [&](unsigned (&b)[4], int nt2, int kk, int g) {
                ldmatrix_x4(b, readK.at(nt2 * 16, kk * 2) + g * 128);
            });

        // The score hook (score.cuh), at each row's own position; ALiBi's part per row and lane
        // is left out of S where the block lies on one side of the diagonal, in row_bias, for
        // the softmax to add back (0 elsewhere); outside the causal mask at d 64 only.
        constexpr bool ROW_BIAS = ScoreT::template has_row_bias<HD, MaskT>();
        float row_bias[1][2];
        if constexpr (ScoreT::REWRITES) {
            float dist[2];
#pragma unroll
            for (int e2 = 0; e2 < 2; ++e2)
                dist[e2] = score.template diagonal<false>(p, pos[e2], col0 + (lane % 4) * 2,
                                                          seqlen_q, seqlen_k);
            score.template apply_fragment<HD, MaskT>(p, s[0], dist, row_bias[0]);
        }
        // Mask (mask.cuh): S_ij[r, c] = -inf where key c is hidden from row r's position, or
        // past the entry's keys.
        mask_fragment_rows(mask, s[0], [&](int e2) { return pos[e2]; }, col0, lane);
        // Online softmax (softmax.cuh): P~_ij in place of S_ij, l and O~ rescaled.
        softmax.template update<ROW_BIAS>(s, o, score.exp2_scale, lane, row_bias);

        // O~ += P~_ij V_j (P~ from registers as the A operand; V_j rows with .trans).
        const SwizzledReader<HD> readV(smem_u32(sv), lane_row_rows_first(lane),
                                       lane_chunk_rows_first(lane));
        warp_mma<T, Tile::KS_PV, false>(
            o,
            [&](unsigned (&a)[4], int, int kk, int) { pack_a_fragment<T>(a, s[0], kk); },
            [&](unsigned (&b)[4], int nd2, int kk, int) {
                ldmatrix_x4_trans(b, readV.at(kk * 16, nd2 * 2));
            });
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with its K/V buffers: the combine reuses them

    // ---- the warps' combine: m = max_w m_w, l = sum_w e^(m_w - m) l_w, O~ likewise ---------
    constexpr int CS = Tile::CS;
    float* cO = reinterpret_cast<float*>(sKV);  // (NWARPS, B_r, CS)
    float* cm = cO + NWARPS * B_r * CS;         // (NWARPS, B_r)
    float* cl = cm + NWARPS * B_r;              // (NWARPS, B_r)
    long long* c_at = reinterpret_cast<long long*>(cl + NWARPS * B_r);  // (B_r, 2)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
        const int r = lane / 4 + e2 * 8;
        const float l_row = softmax.row_sum(0, e2, lane);
        if (lane % 4 == 0) {
            cm[warp * B_r + r] = softmax.m[0][e2];
            cl[warp * B_r + r] = l_row;
        }
#pragma unroll
        for (int nt = 0; nt < NT_O; ++nt)
            *reinterpret_cast<float2*>(cO + (warp * B_r + r) * CS + nt * 8 + (lane % 4) * 2) =
                make_float2(o[0][nt][e2 * 2], o[0][nt][e2 * 2 + 1]);
    }
    __syncthreads();
    const int nheads = p.nheads;
    const bool partial = p.num_splits > 1;
    // Per row r (a thread each): m = max_w m_w, l = sum_w e^(m_w - m) l_w, and in place of
    // l_w the weight of O~_w in O = diag(l)^-1 O~, a_w = e^(m_w - m) / l (0 where the row saw
    // no key of this split: l = 0), in place of m_0 the row's L = m + log l, and where the
    // row's O and L go (-1: a row past the tile's rows). The weights and the divisions are
    // then done once per row, not once per output column.
    if (tid < B_r) {
        const int r = tid, pr = row_tile * B_r + r;
        float m = CUFLASH_NEG_INF;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) m = fmaxf(m, cm[w * B_r + r]);
        const float m_scaled = m == CUFLASH_NEG_INF ? 0.f : m * score.exp2_scale;
        float a[NWARPS], l = 0.f;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) {  // e^(m_w - m), in the softmax's exp2 units
            a[w] = exp2_approx(cm[w * B_r + r] * score.exp2_scale - m_scaled);
            l = fmaf(a[w], cl[w * B_r + r], l);
        }
        const float inv_l = l == 0.f ? 0.f : 1.f / l;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) cl[w * B_r + r] = a[w] * inv_l;
        cm[r] = l == 0.f ? CUFLASH_NEG_INF : m * score.lse_scale + logf(l);
        long long o_at = -1, l_at = 0;
        if (pr < packed_rows) {
            const int g = pr / seqlen_q, posr = pr % seqlen_q, head = h0 + g;
            const long long row = ((long long)batch * nheads + head) * seqlen_q + posr;
            if (partial) {  // the float32 partials O_s, L_s (split-major)
                l_at = (long long)split * p.batch * nheads * seqlen_q + row;
                o_at = l_at * p.d;
            } else {
                l_at = row;
                o_at = batch * p.o_stride_b + posr * p.o_stride_s + head * p.o_stride_h;
            }
        }
        c_at[2 * r] = o_at;
        c_at[2 * r + 1] = l_at;
    }
    __syncthreads();
    for (int i = tid; i < B_r * HD; i += Tile::NTHREADS) {
        const int r = i / HD, c = i % HD;
        const long long o_at = c_at[2 * r];
        if (o_at < 0) continue;
        // O = sum_w a_w O~_w
        float out = 0.f;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w)
            out = fmaf(cl[w * B_r + r], cO[(w * B_r + r) * CS + c], out);
        if (partial) {
            if (c < p.d) p.o_partial[o_at + c] = out;
            if (c == 0) p.lse_partial[c_at[2 * r + 1]] = cm[r];
        } else {
            if (c < p.d) p.o[o_at + c] = T::from_float(out);
            if (c == 0) p.lse[c_at[2 * r + 1]] = cm[r];
        }
    }
}

// The splits' combine (split-KV), after fa2_decode: a warp per query row (merge_splits).
// Grid (ceil(nheads seqlen_q / 4), batch): the entry is the block's y, so that finding a
// row's (b, h, i) takes two 32-bit divisions instead of three 64-bit ones (a subroutine each).
// (__launch_bounds__(128, 4): with no minimum, ptxas for sm_90 kept 40 registers and spilled.)
template <typename T>
__global__ void __launch_bounds__(128, 4)
fa2_decode_combine(const DecodeParams p) {
    grid_dependency_wait();  // (launched as the split attention's dependent: its O_s, L_s)
    const int per_entry = p.nheads * p.seqlen_q;  // (the query rows of one entry)
    const int hi = blockIdx.x * 4 + threadIdx.x / 32, b = blockIdx.y;
    if (hi >= per_entry) return;
    const long long rows = (long long)p.batch * per_entry;
    merge_splits<T>(p, rows, (long long)b * per_entry + hi, b, hi / p.seqlen_q,
                    hi % p.seqlen_q, threadIdx.x % 32);
}

// k, v (batch, seqlen_new, heads_k, d): written into the cache at rows cache_seqlens[b] ..
// + seqlen_new - 1 of each entry (through the block table when paged), 16 bytes per thread.
template <typename T>
__global__ void __launch_bounds__(128)
fa2_decode_append(const DecodeParams p) {
    const int row = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;  // row of the new keys
    launch_dependents();  // (the split attention may start: it waits for these rows)
    const int j = p.cache_seqlens[b] + row;                        // its key index
    const int chunks = p.d / 8;
    elem_t* dst_k = CacheRows(p, p.k, p.k_stride_b, p.k_stride_s, p.k_stride_h, b, hk).row(j);
    elem_t* dst_v = CacheRows(p, p.v, p.v_stride_b, p.v_stride_s, p.v_stride_h, b, hk).row(j);
    const elem_t* src_k = p.k_new + b * p.kn_stride_b + row * p.kn_stride_s + hk * p.kn_stride_h;
    const elem_t* src_v = p.v_new + b * p.vn_stride_b + row * p.vn_stride_s + hk * p.vn_stride_h;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        *reinterpret_cast<Chunk16*>(dst_k + c * 8) = *reinterpret_cast<const Chunk16*>(src_k + c * 8);
        *reinterpret_cast<Chunk16*>(dst_v + c * 8) = *reinterpret_cast<const Chunk16*>(src_v + c * 8);
    }
}

}  // namespace cuflash
