// common.cuh: the small set of device primitives every cuflash kernel uses.
//
// No CUDA headers are included on purpose: the kernels compile the same way under NVRTC
// (through cupy.RawModule, at run time) and under nvcc (the CPU compile check), with no
// include paths to find. 16-bit values travel as raw `unsigned short` bits; every conversion
// and every tensor-core instruction is written as PTX below.
//
// Contents
//   element types      fp16 / bf16 tags: conversion and the matching mma.sync instruction
//   tensor cores       mma_m16n8k16 (fp32 accumulate), ldmatrix x4 (and .trans)
//   async copies       cp.async 16 B with zero fill, commit / wait
//   dependent launch   griddepcontrol: wait for the grid before, let the next one start
//   shared memory      the 16-byte-chunk XOR swizzle used by every tile
//   math               exp2 (ex2.approx), warp-quad reductions, division by a launch constant
#pragma once

namespace cuflash {

// ---------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------

// Two 16-bit values packed in one 32-bit register: the unit of every mma.sync operand.
// pack(lo, hi) puts `lo` in bits 0..15, which is the lower column index in a fragment.
struct fp16 {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
    static __device__ __forceinline__ unsigned short from_float(float x) {
        unsigned short r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
        return r;
    }
    static __device__ __forceinline__ float to_float(unsigned short x) {
        float r;
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x));
        return r;
    }
    // The inverse of pack.
    static __device__ __forceinline__ void unpack(unsigned x, float& lo, float& hi) {
        lo = to_float(static_cast<unsigned short>(x & 0xffffu));
        hi = to_float(static_cast<unsigned short>(x >> 16));
    }
    // D(16x8, f32) += A(16x16) B(16x8)
    static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

struct bf16 {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
    static __device__ __forceinline__ unsigned short from_float(float x) {
        unsigned short r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
        return r;
    }
    static __device__ __forceinline__ float to_float(unsigned short x) {
        return __uint_as_float(static_cast<unsigned>(x) << 16);
    }
    static __device__ __forceinline__ void unpack(unsigned x, float& lo, float& hi) {
        lo = __uint_as_float(x << 16);
        hi = __uint_as_float(x & 0xffff0000u);
    }
    static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

typedef unsigned short elem_t;  // storage of one fp16 / bf16 value
// A TMA tensor map (CUtensorMap): 128 opaque bytes, encoded on the host (cuflash/_tma.py) and
// passed by value inside a Hopper kernel's __grid_constant__ parameter struct (hopper.cuh).
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

struct alignas(16) Chunk16 { unsigned x, y, z, w; };  // one 16-byte vector: 8 elements
struct alignas(16) Float4 { float x, y, z, w; };      // one 16-byte vector of floats
struct alignas(8) Float2 { float x, y; };

// ---------------------------------------------------------------------------------------------
// Shared memory: addresses and the swizzle
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// A tile row of COLS 16-bit elements is COLS/8 chunks of 16 bytes. ldmatrix reads the same chunk
// of 8 consecutive rows; without a swizzle those 8 reads hit the same banks whenever the row
// pitch is a multiple of 128 bytes. Chunk c of row r is stored at chunk swizzle<COLS>(r, c):
//   - inside each full group of 8 chunks: c ^ (r % 8)
//   - in a trailing group of 4 chunks (COLS % 64 == 32): c ^ ((r / 2) % 4)
// Either way 8 consecutive rows land on 8 distinct 16-byte bank groups, for loads (cp.async),
// ldmatrix and the epilogue's stores alike.
template <int COLS>
__device__ __forceinline__ int swizzle(int r, int c) {
    static_assert(COLS % 32 == 0, "tile rows must be a multiple of 32 elements");
    constexpr int NC = COLS / 8;
    if ((c | 7) < NC) return c ^ (r & 7);
    return c ^ ((r >> 1) & 3);
}

// Element offset of (row r, chunk c) in a swizzled (rows x COLS) tile.
template <int COLS>
__device__ __forceinline__ int tile_offset(int r, int c) {
    return r * COLS + swizzle<COLS>(r, c) * 8;
}

// Addresses for ldmatrix reads of a swizzled (rows x COLS) tile, built so that the compiler keeps
// a handful of registers per tile instead of one per (row, chunk) pair.
// A lane reads row R0 + lane_row and chunk C0 + chunk_offset + lane_chunk, where R0 (a multiple
// of 8) and C0 (even) are compile-time constants after unrolling, lane_row % 8 == lane % 8,
// lane_chunk is 0 or 1 and chunk_offset (even) is fixed per warp. The swizzled chunk then
// splits into a part known per lane (4 bases, one per C0 % 8 = 0, 2, 4, 6) plus an immediate.
// A nonzero chunk_offset is allowed only where the whole row is full 8-chunk groups.
template <int COLS>
struct SwizzledReader {
    unsigned full[4];  // inside full 8-chunk groups
    unsigned tail[2];  // inside the trailing 4-chunk group of COLS % 64 == 32
    __device__ __forceinline__ SwizzledReader(unsigned tile_addr, int lane_row, int lane_chunk,
                                              int chunk_offset = 0) {
        const unsigned row_addr = tile_addr + lane_row * COLS * 2;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int s = 2 * q + (chunk_offset & 7);  // may carry into the next group
            const int chunk = (chunk_offset & ~7) + (s & 8)
                            + (((s & 7) | lane_chunk) ^ (lane_row & 7));
            full[q] = row_addr + chunk * 16;
        }
        const int t2 = lane_chunk ^ ((lane_row >> 1) & 3);
#pragma unroll
        for (int q = 0; q < 2; ++q) tail[q] = row_addr + ((2 * q) ^ t2) * 16;
    }
    // Shared address of (row R0 + lane_row, chunk C0 + chunk_offset + lane_chunk), swizzled like
    // tile_offset.
    __device__ __forceinline__ unsigned at(int R0, int C0) const {
        if ((C0 | 7) < COLS / 8) return full[(C0 & 7) >> 1] + R0 * COLS * 2 + (C0 & ~7) * 16;
        return tail[(C0 & 3) >> 1] + R0 * COLS * 2 + (C0 & ~3) * 16;
    }
};

// The two lane patterns of ldmatrix x4 for m16n8k16 operands (see fa2_forward.cu):
//   ROWS_FIRST:  row (lane % 8) + 8 * ((lane / 8) % 2), chunk lane / 16
//                A from a row-major [m][k] tile, or B with .trans from a [k][n] tile
//   CHUNKS_FIRST: row (lane % 8) + 8 * (lane / 16), chunk (lane / 8) % 2
//                B from an [n][k] tile, or A with .trans from a [k][m] tile
__device__ __forceinline__ int lane_row_rows_first(int l) { return l % 8 + 8 * ((l / 8) % 2); }
__device__ __forceinline__ int lane_chunk_rows_first(int l) { return l / 16; }
__device__ __forceinline__ int lane_row_chunks_first(int l) { return l % 8 + 8 * (l / 16); }
__device__ __forceinline__ int lane_chunk_chunks_first(int l) { return (l / 8) % 2; }

// x, as a value the compiler cannot see through: work derived from it is redone where it is
// written instead of being hoisted out of a loop into registers that stay live.
__device__ __forceinline__ int opaque(int x) {
    asm volatile("" : "+r"(x));
    return x;
}

// The k loop of a warp-level matrix product: f(k, g) for k steps of 16, step k + 4 g. When there
// are more than 4 steps, the whole groups of 4 run as a real loop and only the 4 steps inside
// one are unrolled: the compiler then hoists at most a group's operand loads ahead of the
// MMAs, instead of filling every free register with fragments (which pushed loop-invariant
// values into local memory in the backward kernel). One group of 4 steps is 64 elements:
// 8 chunks, one whole swizzle group, so the group offset is a plain byte offset (128 bytes
// along a row, 64 rows down a column). The steps after the last whole group (KSTEPS % 4, a
// head dim of 96, 160 or 224) follow unrolled, as steps 4 (KSTEPS / 4) + k of group 0, so that
// their addresses go through the tile's own swizzle (which may be a 4-chunk tail group).
// GROUPED = false unrolls all the steps (for kernels with registers to spare: hoisted loads
// then hide more shared-memory latency).
template <int KSTEPS, bool GROUPED = true, typename F>
__device__ __forceinline__ void k_loop(F&& f) {
    if constexpr (GROUPED && KSTEPS > 4) {
#pragma unroll 1
        for (int g = 0; g < KSTEPS / 4; ++g)
#pragma unroll
            for (int k = 0; k < 4; ++k) f(k, g);
#pragma unroll
        for (int k = 0; k < KSTEPS % 4; ++k) f(KSTEPS / 4 * 4 + k, 0);
    } else {
#pragma unroll
        for (int k = 0; k < KSTEPS; ++k) f(k, 0);
    }
}

// Zero an accumulator array of m16n8 tiles.
template <int M, int N>
__device__ __forceinline__ void zero(float (&acc)[M][N][4]) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.f;
}
// ... and one row of them (a wgmma accumulator: 64 rows per warpgroup, 16 per warp).
template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
}

// The warp-level matrix product every FA2 kernel is built from:
//     acc[mt][nt] += sum over the KSTEPS k steps of A(mt, k) B(k, nt)
// for MT m16 tiles of A and NT n8 tiles of B (mma.sync m16n8k16, k steps through k_loop).
// load_a(a, mt, kk, g) fills the 4-register A fragment of m16 tile mt at step kk + 4 g;
// load_b(b, nt2, kk, g) fills 4 registers with the B fragments of n8 tiles 2 nt2 and 2 nt2 + 1
// (one ldmatrix x4). Each A fragment then feeds NT MMAs and each B pair 2 MT.
template <typename T, int KSTEPS, bool GROUPED = true, int MT, int NT, typename LoadA,
          typename LoadB>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], LoadA&& load_a,
                                         LoadB&& load_b) {
    static_assert(NT % 2 == 0, "B fragments come in pairs of n8 tiles");
    k_loop<KSTEPS, GROUPED>([&](int kk, int g) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) load_a(a[mt], mt, kk, g);
#pragma unroll
        for (int nt2 = 0; nt2 < NT / 2; ++nt2) {
            unsigned b[4];
            load_b(b, nt2, kk, g);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                T::mma(acc[mt][2 * nt2], a[mt], b[0], b[1]);
                T::mma(acc[mt][2 * nt2 + 1], a[mt], b[2], b[3]);
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// ldmatrix: four 8x8 matrices of 16-bit values per warp; lane i gives the row address
// of matrix i/8, row i%8. Register j of every lane receives matrix j.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// ---------------------------------------------------------------------------------------------
// cp.async: 16-byte global -> shared copies that bypass registers. When `valid` is false the
// 16 bytes are zero-filled instead (src-size 0), which is how tiles are padded past the end
// of a sequence or past the head dim without touching memory outside the input.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool valid) {
    int src_size = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(dst), "l"(src), "r"(src_size));
}
// 4-byte variant (cp.async.ca), for float vectors whose rows need not be 16-byte aligned.
__device__ __forceinline__ void cp_async_4(unsigned dst, const void* src, bool valid) {
    int src_size = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(dst), "l"(src), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N));
}

// ---------------------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90+). A kernel launched as a dependent of the kernel before
// it in the stream (cuflash/_loader.py, Launcher(dependent=True)) may start while that one
// still runs: grid_dependency_wait() then holds it until the earlier grid has finished and
// its writes are visible, so every dependent kernel calls it before its first global access.
// launch_dependents() lets the next such kernel start (its blocks wait in their own
// grid_dependency_wait, on SMs this grid leaves free). Outside a dependent launch, and below
// sm_90, both do nothing.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Chunks [c0, c0 + W) of every row of a (ROWS x COLS) tile (load_tile_async below): W = 8 (a
// whole swizzle group) or 4 (the tail group). NTHREADS / W rows per iteration, a multiple of
// 8, so each thread's swizzled chunk is the same in every row it copies.
template <int ROWS, int COLS, int NTHREADS, int W>
__device__ __forceinline__ void load_segment_async(unsigned base, const elem_t* src,
                                                   long long row_stride, int rows_valid,
                                                   int chunks_valid, int tid, int c0) {
    constexpr int R = NTHREADS / W;
    static_assert(R % 8 == 0, "rows per iteration: a multiple of 8");
    const int r0 = tid / W, c = c0 + tid % W;
    const unsigned dst = base + 2u * tile_offset<COLS>(r0, c);
    const elem_t* g = src + r0 * row_stride + c * 8;
    const long long g_step = R * row_stride;
#pragma unroll
    for (int it = 0; it < (ROWS + R - 1) / R; ++it, g += g_step) {
        const int r = r0 + it * R;
        if (ROWS % R != 0 && r >= ROWS) break;
        const bool valid = r < rows_valid && c < chunks_valid;
        cp_async_16(dst + it * R * COLS * 2, valid ? g : src, valid);
    }
}

// Copy a (ROWS x COLS) tile whose row r starts at src + r * row_stride into swizzled shared
// memory. Rows >= rows_valid and chunks >= chunks_valid (head dim d < COLS) are zero-filled.
// NTHREADS threads share the work, consecutive threads taking consecutive 16-byte chunks of
// a row, so global reads are coalesced.
template <int ROWS, int COLS, int NTHREADS, bool SEGMENTED = true>
__device__ __forceinline__ void load_tile_async(elem_t* smem, const elem_t* src,
                                                long long row_stride, int rows_valid,
                                                int chunks_valid, int tid) {
    constexpr int NC = COLS / 8;
    const unsigned base = smem_u32(smem);
    if constexpr (NTHREADS % NC == 0) {
        // Each thread keeps one chunk column c and steps down ROWS_PER_IT rows at a time. The
        // swizzle depends on the row modulo 8 only, so it repeats every PERIOD steps: PERIOD
        // shared-address registers plus immediates cover the whole tile.
        constexpr int ROWS_PER_IT = NTHREADS / NC;
        constexpr int PERIOD = ROWS_PER_IT % 8 == 0 ? 1 : ROWS_PER_IT % 4 == 0 ? 2
                             : ROWS_PER_IT % 2 == 0 ? 4 : 8;
        const int r0 = tid / NC, c = tid % NC;
        unsigned dst[PERIOD];
#pragma unroll
        for (int p = 0; p < PERIOD; ++p)
            dst[p] = base + 2u * tile_offset<COLS>(r0 + p * ROWS_PER_IT, c);
        const elem_t* g = src + r0 * row_stride + c * 8;
        const long long g_step = ROWS_PER_IT * row_stride;  // bumped, not recomputed per row
#pragma unroll
        for (int it = 0; it < (ROWS + ROWS_PER_IT - 1) / ROWS_PER_IT; ++it, g += g_step) {
            const int r = r0 + it * ROWS_PER_IT;
            if (ROWS % ROWS_PER_IT != 0 && r >= ROWS) break;
            const bool valid = r < rows_valid && c < chunks_valid;
            cp_async_16(dst[it % PERIOD] + (it / PERIOD) * PERIOD * ROWS_PER_IT * COLS * 2,
                        valid ? g : src, valid);
        }
    } else if constexpr (SEGMENTED) {
        // Rows of 12, 20, 24 or 28 chunks (head dims 96, 160, 192, 224): the same scheme per
        // segment of the row, the whole 8-chunk swizzle groups and then the 4-chunk tail, so
        // that every copy is still a bumped pointer and an immediate offset (the flat index
        // below costs a division and a 64-bit multiply per copy; measured +2-16% at those
        // head dims, forward and backward).
#pragma unroll
        for (int g8 = 0; g8 < NC / 8; ++g8)
            load_segment_async<ROWS, COLS, NTHREADS, 8>(base, src, row_stride, rows_valid,
                                                        chunks_valid, tid, 8 * g8);
        if constexpr (NC % 8 != 0)
            load_segment_async<ROWS, COLS, NTHREADS, 4>(base, src, row_stride, rows_valid,
                                                        chunks_valid, tid, NC / 8 * 8);
    } else {
        // Flat index: fewest registers held (for kernels at the edge of the register file).
        constexpr int ITERS = (ROWS * NC + NTHREADS - 1) / NTHREADS;
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int i = tid + it * NTHREADS;
            if ((ROWS * NC) % NTHREADS != 0 && i >= ROWS * NC) break;
            const int r = i / NC, c = i % NC;
            const bool valid = r < rows_valid && c < chunks_valid;
            const elem_t* g = valid ? src + r * row_stride + c * 8 : src;
            cp_async_16(base + 2u * tile_offset<COLS>(r, c), g, valid);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Head dims that are not a multiple of 8 (OddD tiles). A row of d elements then starts on a
// 2-byte boundary only, out of reach of 16-byte copies: tiles move element by element through
// registers instead, padded with zeros past d on chip, into the same swizzled layout. These
// copies are synchronous (in shared memory when the call returns), which every cp.async
// ordering of the kernels also allows. d % 8 == 0 keeps the cp.async path and its code.
// ---------------------------------------------------------------------------------------------

// A kernel's tile with ODD_D set: the same shape, element-wise global loads and stores.
template <class Tile>
struct OddD : Tile {
    static constexpr bool ODD_D = true;
};

// Elements 8c .. 8c + 7 of a row as one 16-byte chunk: zero past d, and everywhere if !valid.
__device__ __forceinline__ Chunk16 load_chunk_elementwise(const elem_t* row, int c, int d,
                                                          bool valid) {
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int col = 8 * c + 2 * k;
        const unsigned lo = valid && col < d ? row[col] : 0u;
        const unsigned hi = valid && col + 1 < d ? row[col + 1] : 0u;
        w[k] = lo | (hi << 16);
    }
    return Chunk16{w[0], w[1], w[2], w[3]};
}
// Store the elements of chunk c that are < d.
__device__ __forceinline__ void store_chunk_elementwise(elem_t* row, int c, int d,
                                                        const Chunk16& v) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int col = 8 * c + 2 * k;
        if (col < d) row[col] = static_cast<elem_t>(w[k] & 0xffffu);
        if (col + 1 < d) row[col + 1] = static_cast<elem_t>(w[k] >> 16);
    }
}
// Store a pair of packed elements at columns col, col + 1 (those < d).
__device__ __forceinline__ void store_pair_elementwise(elem_t* at, int col, int d, unsigned v) {
    if (col < d) at[0] = static_cast<elem_t>(v & 0xffffu);
    if (col + 1 < d) at[1] = static_cast<elem_t>(v >> 16);
}

// load_tile_async's job for OddD tiles: rows >= rows_valid and columns >= d zero-filled.
// U chunks per thread at a time: their 8 U loads issued before any is stored, so that U
// chunks' latencies overlap (one at a time, the forward ran 5-9x slower than at the multiple
// of 8 above; the whole tile at once spilled). The loop over those groups is not unrolled:
// the kernels call this where their accumulators hold the registers.
template <int ROWS, int COLS, int NTHREADS, int U = 4>
__device__ __forceinline__ void load_tile_elementwise(elem_t* smem, const elem_t* src,
                                                      long long row_stride, int rows_valid,
                                                      int d, int tid) {
    constexpr int NC = COLS / 8, TOTAL = ROWS * NC;
    const unsigned base = smem_u32(smem);
#pragma unroll 1
    for (int i0 = tid; i0 < TOTAL; i0 += U * NTHREADS) {
        Chunk16 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // the loads
            const int i = i0 + u * NTHREADS, r = i / NC, c = i % NC;
            const bool valid = i < TOTAL && r < rows_valid;
            v[u] = load_chunk_elementwise(valid ? src + r * row_stride : src, c, d, valid);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {  // then the stores
            const int i = i0 + u * NTHREADS, r = i / NC, c = i % NC;
            if (TOTAL % (U * NTHREADS) != 0 && i >= TOTAL) break;
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                         :: "r"(base + 2u * tile_offset<COLS>(r, c)), "r"(v[u].x), "r"(v[u].y),
                            "r"(v[u].z), "r"(v[u].w) : "memory");
        }
    }
}

// A kernel's tile loader: load_tile_async (chunks = d / 8 of 16 bytes per row), or for OddD
// tiles load_tile_elementwise (d elements per row).
template <class Tile, int ROWS, int COLS, int NTHREADS, bool SEGMENTED = true>
__device__ __forceinline__ void load_tile(elem_t* smem, const elem_t* src, long long row_stride,
                                          int rows_valid, int chunks, int d, int tid) {
    if constexpr (Tile::ODD_D)
        load_tile_elementwise<ROWS, COLS, NTHREADS>(smem, src, row_stride, rows_valid, d, tid);
    else
        load_tile_async<ROWS, COLS, NTHREADS, SEGMENTED>(smem, src, row_stride, rows_valid,
                                                         chunks, tid);
}

// ---------------------------------------------------------------------------------------------
// Math
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; 2^-inf = 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 2^x without the MUFU unit (its ex2 is the softmax's bottleneck at small head dims): on the
// FMA and integer pipes, for the x <= 0 of a softmax. x = j + f with j = round(x) (adding
// 1.5 * 2^23 leaves round(x) in the low mantissa bits of t) and f in [-0.5, 0.5]; 2^f by a
// degree-3 polynomial (relative error 7.7e-5, against P~'s rounding to bf16 / fp16 of 3.9e-3 /
// 4.9e-4); times 2^j, built in the exponent bits (the shift keeps round(x) of t's bits and
// drops the rest). 0 below 2^-125 (and for -inf: a masked score). NaN stays NaN through the
// multiply (adding j into p's bits instead would turn the GPU's NaN, 0x7fffffff, into
// FLT_MAX).
__device__ __forceinline__ float exp2_poly(float x) {
    const float t = x + 12582912.f;
    const float f = x - (t - 12582912.f);
    const float p = fmaf(fmaf(fmaf(0.05508868f, f, 0.24260405f), f, 0.6932762f), f,
                         0.99992895f);
    const float two_j = __uint_as_float((static_cast<unsigned>(__float_as_int(t)) << 23) +
                                        0x3f800000u);
    return x < -125.f ? 0.f : p * two_j;
}

// n / d and n % d for 0 <= n < 2^31 and a divisor d >= 1 fixed for the launch (the heads, a
// pair's units): a multiply-high, an add and a shift (the round-up method of Granlund and
// Montgomery), where a division by a run-time int is ~25 dependent instructions. The Hopper
// forward's tile walk divided by the units of a pair and the heads once per tile, ~100
// instructions on the consumers' path from one tile to the next (ncu, session 27).
//   shift = ceil(log2 d), mul = floor(2^32 (2^shift - d) / d) + 1 (< 2^32),
//   n / d = (umulhi(n, mul) + n) >> shift   (the sum < 2^32 for n < 2^31).
// mul and shift come from the host (cuflash/_registry.py, fast_div) in the kernel's
// parameters: worked out in the kernel they took registers for the whole kernel, and the
// register-tight tiles spilled.
struct FastDiv {
    int d;
    unsigned mul;
    int shift;
    __device__ __forceinline__ int div(int n) const {
        return static_cast<int>((__umulhi(static_cast<unsigned>(n), mul) +
                                 static_cast<unsigned>(n)) >> shift);
    }
    __device__ __forceinline__ int mod(int n) const { return n - div(n) * d; }
};

// Reductions over the 4 lanes (a "quad") that hold one row of an mma accumulator.
__device__ __forceinline__ float shfl_xor(float x, int lane_mask) {
    float y;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                 : "=f"(y) : "f"(x), "r"(lane_mask));
    return y;
}
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, shfl_xor(x, 1));
    return fmaxf(x, shfl_xor(x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += shfl_xor(x, 1);
    return x + shfl_xor(x, 2);
}
// The 4 x 4 transpose of 32-bit values across a quad: lane t holds a[k] = M[t][k] on entry
// and M[k][t] on return (two exchange stages, with lanes t ^ 2 and then t ^ 1, each swapping
// the off-diagonal 2 x 2 blocks). With a[k] the packed pair of n8 tile 4 g + k of an mma
// accumulator row (columns 8 (4 g + k) + 2 t, + 1), lane t ends with columns 8 (4 g + t) to
// 8 (4 g + t) + 7: one 16-byte store instead of four 4-byte ones. Every lane must call it.
__device__ __forceinline__ void quad_transpose(unsigned (&a)[4], int lane) {
    const bool b = lane & 2, c = lane & 1;
    unsigned r0 = __shfl_xor_sync(0xffffffffu, b ? a[0] : a[2], 2);
    unsigned r1 = __shfl_xor_sync(0xffffffffu, b ? a[1] : a[3], 2);
    a[0] = b ? r0 : a[0];
    a[1] = b ? r1 : a[1];
    a[2] = b ? a[2] : r0;
    a[3] = b ? a[3] : r1;
    r0 = __shfl_xor_sync(0xffffffffu, c ? a[0] : a[1], 1);
    r1 = __shfl_xor_sync(0xffffffffu, c ? a[2] : a[3], 1);
    a[0] = c ? r0 : a[0];
    a[2] = c ? r1 : a[2];
    a[1] = c ? a[1] : r0;
    a[3] = c ? a[3] : r1;
}

// Row pair e2 of m16n8 accumulators (NT n8 tiles: columns 0 .. 8 NT) to a row of global
// memory in the input dtype, in 16-byte stores: a quad transpose gives each lane 8
// consecutive columns (4-byte stores of column pairs wrote each 128-byte line in 8 pieces).
// `row` starts on a 16-byte boundary; columns from d on, and rows where !row_ok, are not
// stored (every lane takes part in the transposes). NT a multiple of 4.
template <typename T, int NT>
__device__ __forceinline__ void store_accumulator_row(const float (&acc)[NT][4], int e2,
                                                      elem_t* row, bool row_ok, int d,
                                                      int lane) {
#pragma unroll
    for (int g = 0; g < NT / 4; ++g) {
        unsigned a[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            a[k] = T::pack(acc[4 * g + k][e2 * 2], acc[4 * g + k][e2 * 2 + 1]);
        quad_transpose(a, lane);
        const int col = (4 * g + lane % 4) * 8;  // (d is a multiple of 8)
        if (row_ok && col < d)
            *reinterpret_cast<uint4*>(row + col) = make_uint4(a[0], a[1], a[2], a[3]);
    }
}

// The same row in float32 (the Hopper forward's split tail: a part's O_i, HD columns, all
// stored): each lane its own column pairs, 8-byte stores, L2 only (the merge reads them there).
template <int NT>
__device__ __forceinline__ void store_accumulator_row_f32(const float (&acc)[NT][4], int e2,
                                                          float* row, int lane) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        __stcg(reinterpret_cast<float2*>(row + nt * 8 + (lane % 4) * 2),
               make_float2(acc[nt][e2 * 2], acc[nt][e2 * 2 + 1]));
}

// The A fragment of k-step kk of a product P V whose P sits in accumulators (the mma.sync
// m16n8 layout, which the wgmma accumulator shares): the accumulators of n8 tiles 2 kk and
// 2 kk + 1, packed to 16-bit pairs.
template <typename T, int NT>
__device__ __forceinline__ void pack_a_fragment(unsigned (&a)[4], const float (&s)[NT][4],
                                                int kk) {
    a[0] = T::pack(s[2 * kk][0], s[2 * kk][1]);
    a[1] = T::pack(s[2 * kk][2], s[2 * kk][3]);
    a[2] = T::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = T::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// The sm_90-only helpers below trap on older GPUs instead of compiling to nothing; the kernels
// reach them only on paths their templates select for sm_90 (fa2_backward.cu static_asserts
// DQ_BULK == 0 below sm_90).
//
// Atomic float add of 4 consecutive floats (16-byte aligned), one vector reduction (sm_90+),
// done only where `pred` holds. Only the sum is needed, so it is a RED, not an ATOM; the guard
// is a PTX predicate, so a row-bounds check costs no branch.
__device__ __forceinline__ void red_add_f32x4(bool pred, float* p, float a, float b, float c,
                                              float d) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %0, 0;\n"
                 "@p red.global.add.v4.f32 [%1], {%2, %3, %4, %5}; }"
                 :: "r"((int)pred), "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
// Scalar variant (sm_80+).
__device__ __forceinline__ void red_add_f32(bool pred, float* p, float a) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %0, 0;\n"
                 "@p red.global.add.f32 [%1], %2; }"
                 :: "r"((int)pred), "l"(p), "f"(a) : "memory");
}

// Split work's count-in (the Hopper kernels' split tails): a tile's result is made of `parts`
// parts that different thread blocks compute; each warp of a part, once all its lanes have
// written their share of it to global memory and fenced (__threadfence, then __syncwarp),
// counts itself in at its `count`. True in every lane of the warp that counts in last: it may
// then read every part's writes, and `count` is set back to 0 for the next launch. Lane 0
// counts in; where it is last, its fence orders the others' writes, seen through the count,
// before the warp's loads, which __syncwarp orders after it. No warp waits on another.
__device__ __forceinline__ bool count_in_last(int* count, int parts, int lane) {
    int before = 0;
    if (lane == 0) {
        before = atomicAdd(count, 1);
        if (before == parts - 1) {
            __threadfence();
            *count = 0;
        }
    }
    __syncwarp();
    return __shfl_sync(0xffffffffu, before, 0) == parts - 1;
}

// ---------------------------------------------------------------------------------------------
// Bulk asynchronous reduction (sm_90+): the copy engine adds a contiguous run of floats from
// shared memory into global memory, element by element (atomically), while the threads go on.
// ---------------------------------------------------------------------------------------------

// global[dst .. dst + bytes) += shared[src .. src + bytes), float32; 16-byte aligned, bytes a
// multiple of 16. Completes asynchronously: see bulk_wait_read / bulk_wait.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0;\n"
                 "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [g], [%1], %2;\n"
                 "cp.async.bulk.commit_group; }"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
// global[dst .. dst + bytes) = shared[src .. src + bytes) (a plain bulk copy, same rules).
__device__ __forceinline__ void bulk_store(float* dst, unsigned src, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0;\n"
                 "cp.async.bulk.global.shared::cta.bulk_group [g], [%1], %2;\n"
                 "cp.async.bulk.commit_group; }"
                 :: "l"(dst), "r"(src), "r"(bytes) : "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
// Wait until at most PENDING of this thread's bulk operations (the most recent ones) have not
// yet read their shared-memory source (which may then be overwritten), or (bulk_wait) until all
// have completed entirely.
template <int PENDING>
__device__ __forceinline__ void bulk_wait_read() {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(PENDING) : "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
__device__ __forceinline__ void bulk_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
// Ordered hand-off between thread blocks through a counter in global memory (the
// deterministic backward's dQ additions, sm_90+; fa2_backward.cu, "Deterministic mode").
// wait_counter: spin until *counter == value, then let this thread's later bulk operations
// follow what it saw. set_counter: *counter = value, called once this thread's bulk operations
// have completed (bulk_wait), so that whoever reads the value issues its own only after they
// were performed in L2. The store is relaxed, not a release: the bulk wait has already seen the
// writes performed, and a release (a full memory barrier in front of the store, which waits
// for every outstanding access of the thread) measured 10-30% slower on the whole backward.
__device__ __forceinline__ void wait_counter(const int* counter, int value) {
#if __CUDA_ARCH__ >= 900
    int seen;
    do {
        asm volatile("ld.acquire.gpu.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen != value);
    asm volatile("fence.proxy.async.global;" ::: "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
// The same for turns shared by several bulk operations (the Hopper backward's dQ groups of
// one step, each counted when done): wait_counter_at_least spins until *counter >= value,
// add_counter adds 1 once this thread's bulk operations have completed (same rules).
__device__ __forceinline__ void wait_counter_at_least(const int* counter, int value) {
#if __CUDA_ARCH__ >= 900
    int seen;
    do {
        asm volatile("ld.acquire.gpu.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < value);
    asm volatile("fence.proxy.async.global;" ::: "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
__device__ __forceinline__ void add_counter(int* counter) {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.global;\n"
                 "red.relaxed.gpu.global.add.s32 [%0], 1;" :: "l"(counter) : "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
__device__ __forceinline__ void set_counter(int* counter, int value) {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.global;\n"
                 "st.relaxed.gpu.s32 [%0], %1;" :: "l"(counter), "r"(value) : "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}
// 16-byte shared-memory store to a 32-bit shared address.
__device__ __forceinline__ void st_shared_v4(unsigned addr, float a, float b, float c, float d) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
// 16 bytes of ints to and from shared memory, where the asm keeps them in order with the
// mbarrier operations around them (the Hopper forward's tile ring).
__device__ __forceinline__ void st_shared_v4(unsigned addr, int4 v) {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};"
                 :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ int4 ld_shared_v4_s32(unsigned addr) {
    int4 v;
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}
// A 32-bit load from shared memory that the compiler keeps where it is written (it is never
// hoisted into a register held across a loop).
__device__ __forceinline__ int ld_shared_s32(unsigned addr) {
    int v;
    asm volatile("ld.shared.s32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}
// Make this thread's shared-memory writes visible to the copy engine (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    __trap();  // sm_90 only: a call on an older GPU must not silently do nothing
#endif
}

// A compile-time bool as a type (selects the masked / unmasked variant of a loop body).
template <bool V>
struct Bool { static constexpr bool value = V; };
// A compile-time int as a type (a template argument passed through a generic lambda).
template <int V>
struct Int { static constexpr int value = V; };

#define CUFLASH_NEG_INF (__int_as_float(0xff800000))

}  // namespace cuflash
