// backward_passes.cuh: the two passes around the backward's main kernel, shared by the
// portable backward (fa2_backward.cu) and the Hopper one (fa2_backward_sm90.cu):
//   fa2_backward_preprocess   D = rowsum(dO ∘ O)                       (before; Hopper: and
//                             L log2 e, dQ_accum = 0)
//   fa2_backward_dq           dQ = softmax_scale * sum(dQ_accum)       (after, dQ atomics)
//   fa2_backward_dq_bulk      the same, for dQ_accum in fragment order (after, bulk dQ)
// Each takes its family's parameter struct (Params: BwdParams or Sm90BwdParams, which
// holds every BwdParams field), so that a launch's three kernels share one buffer.
#pragma once

#include "common.cuh"
#include "params.cuh"
#include "seqinfo.cuh"
#include "mask.cuh"
#include "block_range.cuh"

namespace cuflash {

// ---------------------------------------------------------------------------------------------
// D = rowsum(dO ∘ O)
// ---------------------------------------------------------------------------------------------
// G = p.lanes lanes (a power of two >= ceil(d / 8)) share one query row, each taking 8 elements;
// grid (ceil(seqlen_q / (128 / G)), heads, batch). D is (batch, heads, seqlen_q), contiguous.
// PAD (the Hopper backward): D and p.lse_log2 = L log2(e) are (batch, heads, seqlen_q rounded
// up to PAD) (packed: as dQ_accum, see below), so that each row block of both is one aligned
// bulk copy; the grid covers the padded rows, which get D = 0 and L log2(e) = +inf, as do rows
// that see no key (L = -inf): their P is exp2(... - inf) = 0.
template <typename T, typename SeqT = DenseSeq, typename Params = BwdParams, int PAD = 0>
__global__ void __launch_bounds__(128)
fa2_backward_preprocess(const Params p) {
    // (the Hopper backward's main kernel is this pass's dependent launch: it may start its
    // blocks, and load K_j and V_j, once every block here has started; what it reads of
    // this pass's output it reads after its grid_dependency_wait)
    launch_dependents();
    const int G = p.lanes;
    const int head = blockIdx.y, batch = blockIdx.z, nheads = gridDim.y;
    const SeqInfo seq = SeqT::info(p, batch);
    const int seqlen_q = seq.seqlen_q;  // (packed: this entry's; the grid covers the longest)
    const int row = blockIdx.x * (128 / G) + threadIdx.x / G, c = threadIdx.x % G;
    float acc = 0.f;
    const int d = p.d;
    if (row < seqlen_q && c * 8 < d) {
        const elem_t* o_row =
            p.o + seq.q_offset(p.o_stride_b, p.o_stride_s) + row * p.o_stride_s + head * p.o_stride_h;
        const elem_t* do_row = p.dout + seq.q_offset(p.do_stride_b, p.do_stride_s) +
                               row * p.do_stride_s + head * p.do_stride_h;
        // (d % 8 != 0: rows 2-byte aligned, element by element, zeros past d)
        const bool whole = d % 8 == 0;
        const Chunk16 o = whole ? *reinterpret_cast<const Chunk16*>(o_row + c * 8)
                                : load_chunk_elementwise(o_row, c, d, true);
        const Chunk16 g = whole ? *reinterpret_cast<const Chunk16*>(do_row + c * 8)
                                : load_chunk_elementwise(do_row, c, d, true);
        const elem_t* oe = reinterpret_cast<const elem_t*>(&o);
        const elem_t* ge = reinterpret_cast<const elem_t*>(&g);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(T::to_float(oe[e]), T::to_float(ge[e]), acc);
    }
    for (int offset = G / 2; offset > 0; offset /= 2) acc += shfl_xor(acc, offset);
    if constexpr (PAD > 0) {
        // (packed: the rows of (heads, p.ws_blocks) row blocks of PAD rows, the entry's from
        // p.row_block_offsets[batch], as dQ_accum's)
        const int rows = (seqlen_q + PAD - 1) / PAD * PAD;
        const long long at =
            (SeqT::PACKED ? ((long long)head * p.ws_blocks + p.row_block_offsets[batch]) * PAD
                          : ((long long)batch * nheads + head) * rows) + row;
        if (c == 0 && row < rows) {
            const long long l_at = seq.row_vector(head, nheads) + row;
            const float L = row < seqlen_q ? p.lse[l_at] : CUFLASH_NEG_INF;
            constexpr float LOG2E = 1.4426950408889634f;
            p.lse_log2[at] = L == CUFLASH_NEG_INF ? -CUFLASH_NEG_INF : L * LOG2E;
            p.dsum[at] = acc;  // (0 past the end of Q)
        }
        // Dense, not deterministic: dQ_accum = 0 for this block's rows (their HD floats each,
        // in fragment order: row block i is the i-th run of PAD x HD floats), so that the main
        // kernel's bulk reductions add into zeros without a memset of their own. (Ordered mode's
        // first addition into a row block is a store; packed batches' workspace comes zeroed.)
        if (!SeqT::PACKED && !p.deterministic) {
            const int r0 = blockIdx.x * (128 / G), nr = min(128 / G, rows - r0);
            const int hd = p.dq_accum_cols;
            Float4* z = reinterpret_cast<Float4*>(
                p.dq_accum + (((long long)batch * nheads + head) * rows + r0) * hd);
            for (int k = threadIdx.x; k < nr * hd / 4; k += 128) z[k] = Float4{0.f, 0.f, 0.f, 0.f};
        }
    } else {
        if (c == 0 && row < seqlen_q) p.dsum[seq.row_vector(head, nheads) + row] = acc;
    }
}


// ---------------------------------------------------------------------------------------------
// dQ = softmax_scale * sum over slices of dQ_accum, in the input dtype
// ---------------------------------------------------------------------------------------------
// One thread per 8 elements of a row; grid (ceil(seqlen_q * ceil(d / 8) / 128), heads, batch).
// dQ_accum: (splits, batch, heads, seqlen_q, hd) with hd = p.dq_accum_cols, the main kernel's
// head-dim bucket.
// dQ: (batch, seqlen_q, heads, d) with strides (last dim contiguous). Packed batches: the grid
// as for the longest entry (p.seqlen_q rows), an entry's rows past its own length skipped; the
// workspace compact, (heads, total_q, hd).
template <typename T, typename SeqT = DenseSeq, typename Params = BwdParams>
__global__ void __launch_bounds__(128)
fa2_backward_dq(const Params p) {
    const int splits = p.splits, seqlen_q = p.seqlen_q, d = p.d, hd = p.dq_accum_cols;
    const float softmax_scale = p.softmax_scale;
    const int head = blockIdx.y, batch = blockIdx.z, nheads = gridDim.y, nbatch = gridDim.z;
    const int chunks = (d + 7) / 8;  // (the last one partial where d % 8 != 0)
    const long long idx = (long long)blockIdx.x * 128 + threadIdx.x;
    if (idx >= (long long)seqlen_q * chunks) return;
    const int row = idx / chunks, c = idx % chunks;
    const SeqInfo seq = SeqT::info(p, batch);
    if (SeqT::PACKED && row >= seq.seqlen_q) return;
    const long long slice = (long long)nbatch * nheads * seqlen_q * hd;
    // (packed: the compact workspace, (heads, total_q, hd), one slice)
    const float* src = p.dq_accum + c * 8 +
        (SeqT::PACKED ? ((long long)head * p.total_q + seq.start_q + row) * hd
                      : (((long long)batch * nheads + head) * seqlen_q + row) * hd);
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
    elem_t* dq_row = p.dq + seq.q_offset(p.dq_stride_b, p.dq_stride_s) + row * p.dq_stride_s +
                     head * p.dq_stride_h;
    if (d % 8 == 0)
        *reinterpret_cast<Chunk16*>(dq_row + c * 8) = out;
    else  // (2-byte aligned rows)
        store_chunk_elementwise(dq_row, c, d, out);
}

// The same, for dQ_accum in fragment order (fa2_backward with DQ_BULK, and the Hopper
// backward; the tile parameters must match). One thread per Tile::DQ_VEC n8 tiles of a
// fragment row (4 floats each: rows g and g + 8, two columns), grid (ceil(T_r * B_r * HD / 4 /
// DQ_VEC / 128), heads, batch). DQ_VEC = 1: each thread stores its two column pairs, 4 bytes
// each. DQ_VEC = 4 (the Hopper tile: d a multiple of 8, dQ C-contiguous on a 16-byte boundary):
// a quad transpose gives each lane 8 consecutive columns of a row, one 16-byte store (the 4-byte
// pairs wrote each 32-byte sector half at a time: 69 us for d 128, 16k tokens x 16 heads on the
// H200, 57% of the DRAM's bandwidth; session 24, ncu).
// Deterministic mode (p.deterministic = 1; dQ_accum not zeroed): row block i was written iff
// some column block sees it (n_i > 0).
// Packed batches: the grid as for the longest entry (p.seqlen_q rows), the workspace compact:
// (heads, p.ws_blocks) row blocks, entry b's from p.row_block_offsets[b].
template <typename T, typename Tile, typename MaskT, typename SeqT = DenseSeq,
          typename Params = BwdParams>
__global__ void __launch_bounds__(128)
fa2_backward_dq_bulk(const Params p) {
    grid_dependency_wait();  // (the Hopper backward: the main kernel's dependent launch)
    constexpr int HD = Tile::HD, B_r = Tile::B_r, B_c = Tile::B_c, WM_DQ = Tile::WM_DQ;
    constexpr int V = Tile::DQ_VEC;
    static_assert(V == 1 || (V == 4 && Tile::DQ_PASS % 4 == 0 && !Tile::ODD_D),
                  "the dQ pass: one n8 tile a thread, or four with d a multiple of 8");
    const int head = blockIdx.y, batch = blockIdx.z, nheads = gridDim.y;
    const SeqInfo seq = SeqT::info(p, batch);  // (packed: the entry's lengths)
    const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k, d = p.d;
    const float softmax_scale = p.softmax_scale;
    constexpr int FRAGS = B_r * HD / 4;  // per row block
    const int T_r = (p.seqlen_q + B_r - 1) / B_r;  // (the workspace's)
    const long long t = (long long)blockIdx.x * 128 + threadIdx.x;  // (whole warps per i)
    if (t >= (long long)T_r * (FRAGS / V)) return;
    // Undo Tile::dq_fragment: f = i FRAGS + (((warp P + pass) Q_MT + mt) DQ_PASS + nt) 32 + lane,
    // this thread's n8 tiles nt = V nq .. V nq + V - 1
    const int i = t / (FRAGS / V);
    int x = t % (FRAGS / V);
    const int lane = x % 32;
    x /= 32;
    const int nq = x % (Tile::DQ_PASS / V);
    x /= Tile::DQ_PASS / V;
    const int mt = x % Tile::Q_MT;
    x /= Tile::Q_MT;
    const int pass = x % Tile::DQ_PASSES, warp = x / Tile::DQ_PASSES;
    const int row = i * B_r + (warp % WM_DQ) * Tile::Q_MW + mt * 16 + lane / 4;
    const int col0 = (warp / WM_DQ) * Tile::Q_NW + (pass * Tile::DQ_PASS + V * nq) * 8;
    if (SeqT::PACKED && i * B_r >= seqlen_q) return;  // (past the entry's row blocks)
    // (packed: the compact workspace, (heads, ws_blocks) row blocks, the entry's from its offset)
    const long long f0 = (long long)i * FRAGS +
                         ((((warp * Tile::DQ_PASSES + pass) * Tile::Q_MT + mt) * Tile::DQ_PASS +
                           V * nq) * 32 + lane);
    const float* src = p.dq_accum + f0 * 4 +
        (SeqT::PACKED ? ((long long)head * p.ws_blocks + p.row_block_offsets[batch]) * FRAGS * 4
                      : ((long long)batch * nheads + head) * T_r * FRAGS * 4);
    // (without a mask that hides keys from whole row blocks, every row block is written)
    bool written = !p.deterministic || !(MaskT::CAUSAL || MaskT::LOCAL);
    if (!written) {
        const ColumnBlocks cb = column_blocks<B_r, B_c>(MaskT(p, seqlen_q, seqlen_k), i);
        written = cb.end > cb.begin;
    }
    // dQ = softmax_scale dQ_accum, tile k's four floats (n8 tile k of this thread's V: 32 lanes
    // x 4 floats further on)
    float acc[V][4];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const Float4 v = written ? *reinterpret_cast<const Float4*>(src + k * 128)
                                 : Float4{0.f, 0.f, 0.f, 0.f};
        acc[k][0] = v.x, acc[k][1] = v.y, acc[k][2] = v.z, acc[k][3] = v.w;
    }
    elem_t* out = p.dq + seq.q_offset(p.dq_stride_b, p.dq_stride_s) + head * p.dq_stride_h;
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {  // rows g and g + 8
        const bool row_ok = row + 8 * e2 < seqlen_q;
        elem_t* out_row = out + (row + 8 * e2) * p.dq_stride_s;
        unsigned a[V];  // the row's column pairs of each n8 tile, scaled and packed
#pragma unroll
        for (int k = 0; k < V; ++k)
            a[k] = T::pack(acc[k][2 * e2] * softmax_scale, acc[k][2 * e2 + 1] * softmax_scale);
        if constexpr (V == 4) {
            quad_transpose(a, lane);  // (every lane: n8 tile lane % 4, its 8 columns)
            const int col = col0 + (lane % 4) * 8;
            if (row_ok && col < d)  // (the zero padding of the head dim: whole n8 tiles)
                *reinterpret_cast<uint4*>(out_row + col) = make_uint4(a[0], a[1], a[2], a[3]);
        } else {
            const int col = col0 + (lane % 4) * 2;
            if (!row_ok || col >= d) continue;  // (the zero padding of the head dim)
            if constexpr (Tile::ODD_D)  // (2-byte aligned rows; the pair may end past d)
                store_pair_elementwise(out_row + col, col, d, a[0]);
            else
                *reinterpret_cast<unsigned*>(out_row + col) = a[0];
        }
    }
}


}  // namespace cuflash
