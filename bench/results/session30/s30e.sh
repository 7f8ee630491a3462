#!/bin/bash
# Session 30, call 3 (issue 19): variable-length batches at d 64 on the plain call's tile,
# three consumers at B_c 128 (the packed kernels' epilogue reloads the entry's offsets,
# seqinfo.cuh PackedSeq::again; on main B_c 112, as B_c 128 spilled there), against main's in
# turns (bench/results/session30/trees/main: `git archive HEAD cuflash kernels bench`), forward
# only (the backward's kernels are unchanged), 2 rounds.
source bench/device_call.sh
T=bench/results/session30/trees/main
precompile "head_dims=(64,), windows=True, varlen=True, max_workers=16"
ab_varlen $T 64 32 "1 2"
# (call 5 ran the same with rounds "3 4".)
