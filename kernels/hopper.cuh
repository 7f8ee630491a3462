// hopper.cuh: the sm_90a primitives of the Hopper kernels, and nothing else.
//
//   mbarriers          init, arrive (with an expected transaction count), wait on a phase
//   TMA                a 4-d tile of a tensor map -> shared memory, completing on an mbarrier;
//                      a 1-d bulk copy likewise
//   wgmma              fence / commit / wait, shared-memory matrix descriptors (128-byte
//                      swizzle), register fences for the accumulators; the instructions
//                      themselves are in wgmma.cuh (one per shape, generated)
//   warp roles         setmaxnreg (registers moved from the producer to the consumers), named
//                      barriers (the consumers' turns)
//
// Every function traps when compiled for anything but sm_90a instead of compiling to nothing
// (the Hopper kernels are only launched there; the compile check builds them for sm_90a).
#pragma once

#include "common.cuh"
#include "wgmma.cuh"

namespace cuflash {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define CUFLASH_SM90A 1
#else
#define CUFLASH_SM90A 0
#endif
#if CUFLASH_SM90A
#define CUFLASH_SM90A_ONLY(...) __VA_ARGS__
#else
#define CUFLASH_SM90A_ONLY(...) __trap();  // sm_90a only: never a silent no-op elsewhere
#endif

// ---- mbarriers (shared-memory barriers with a phase bit and a transaction count) -----------
__device__ __forceinline__ void mbar_init(unsigned bar, int count) {
    CUFLASH_SM90A_ONLY(
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");)
}
// Make the initialised barriers visible to the copy engine (the async proxy) and the cluster.
__device__ __forceinline__ void mbar_init_fence() {
    CUFLASH_SM90A_ONLY(asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");)
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    CUFLASH_SM90A_ONLY(
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(bar), "r"(bytes) : "memory");)
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    CUFLASH_SM90A_ONLY(
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");)
}
// Wait until the phase of parity `parity` has completed. (A fresh barrier is in phase 0, so a
// wait on parity 1 returns at once: "the slot was free before anyone used it".)
__device__ __forceinline__ void mbar_wait(unsigned bar, int parity) {
    CUFLASH_SM90A_ONLY(
        asm volatile(
            "{\n"
            ".reg .pred done;\n"
            "wait_%=:\n"
            "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
            "@!done bra wait_%=;\n"
            "}" :: "r"(bar), "r"(parity) : "memory");)
}

// ---- TMA ----------------------------------------------------------------------------------
// The box of `map` at coordinates (c0 innermost .. c3) -> shared memory at `dst` (1024-byte
// aligned for the 128-byte swizzle); its bytes count towards `bar`'s transaction count.
// Coordinates past the tensor's end are filled with zeros (the box still counts in full).
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TensorMap* map, unsigned bar,
                                            int c0, int c1, int c2, int c3) {
    CUFLASH_SM90A_ONLY(
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3, %4, %5}], [%6];"
            :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
               "r"(c2), "r"(c3), "r"(bar)
            : "memory");)
}

// `bytes` (a multiple of 16) from global memory at `src` (16-byte aligned) -> shared memory at
// `dst` (16-byte aligned), counting towards `bar`'s transaction count.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes,
                                          unsigned bar) {
    CUFLASH_SM90A_ONLY(
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1], %2, [%3];"
            :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");)
}

// ---- wgmma --------------------------------------------------------------------------------
// Order this warpgroup's earlier register writes (the accumulators, A fragments) before the
// wgmma instructions that follow.
__device__ __forceinline__ void wgmma_fence() {
    CUFLASH_SM90A_ONLY(asm volatile("wgmma.fence.sync.aligned;" ::: "memory");)
}
__device__ __forceinline__ void wgmma_commit() {
    CUFLASH_SM90A_ONLY(asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");)
}
// Wait until at most N committed groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    CUFLASH_SM90A_ONLY(asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");)
}
// Pin the accumulators at this point of the program: the compiler may not move their reads
// or writes across it (the wgmma that writes them runs asynchronously until wgmma_wait).
template <int NT>
__device__ __forceinline__ void fence_accumulators(float (&d)[NT][4]) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e]) :: "memory");
}

// Shared-memory matrix descriptor for a tile stored as TMA writes it with the 128-byte
// swizzle: rows of 64 16-bit elements (128 bytes), 8-row atoms of 1024 bytes, atoms 1024-byte
// aligned. `addr`: the first element the instruction reads (a 16-byte-aligned byte offset
// inside an atom selects its k16 step). leading: the byte distance between 64-column groups
// (N-major operands with N > 64; unused for K-major ones), stride: between 8-row groups.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned leading,
                                                        unsigned stride) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) |
           (unsigned long long)((leading >> 4) & 0x3FFF) << 16 |
           (unsigned long long)((stride >> 4) & 0x3FFF) << 32 |
           1ull << 62;  // 128-byte swizzle
}

// ---- warp roles ---------------------------------------------------------------------------
// Named barriers (ids 1..15; 0 is __syncthreads): wait until `threads` threads have reached
// barrier `id` (this warp's 32 count), or only count this warp's arrival and go on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
// Raise / lower this warpgroup's register allocation (the kernel needs __launch_bounds__(N, 1)).
template <int REGS>
__device__ __forceinline__ void regs_increase() {
    CUFLASH_SM90A_ONLY(asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(REGS));)
}
template <int REGS>
__device__ __forceinline__ void regs_decrease() {
    CUFLASH_SM90A_ONLY(asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(REGS));)
}

}  // namespace cuflash
