#!/bin/bash
# Staged for session 30 (not run), call 1: the tile's last P~V over the keys its consumer's
# rows see (last_pv.patch, applied to the working tree; make trees/main with `git archive
# HEAD cuflash kernels` BEFORE applying it). In the loop P~V stays at full width; only the
# P~V issued after the loop (the tile's last block: the end of K where 176 does not divide
# it, the causal diagonal) runs fewer k-steps, one straight-line run per count (with_count,
# common.cuh), so that ptxas injects no warpgroup.arrive (C7519). Session 29's skips inside the
# loop measured 4-8% slower (narrow_pv.patch); all 170 sm_90a forward kernels of this one
# compile clean (CPU). Predicted: up to 1.5% less time at d 128 n 2048 and 4096 (3-7 of 11
# k-steps of one block in 12 or 24), less at n 8k-16k; nothing at d 64 and 256 beyond noise
# (their tiles divide the standard grid's lengths), a little at causal.
source bench/device_call.sh
T=bench/results/session30/trees
precompile "head_dims=(64, 128, 256), backward=False, max_workers=16"
ab_fwd $T/main
ab_fwd $T/main fp16 128 ab_fwd_fp16
grep -h -o "max diff.*" $OUT/ab_fwd.log $OUT/ab_fwd_fp16.log | sort | uniq -c | head -5
