#!/bin/bash
# Staged for session 31 (not run), call 3 (issue 19): variable-length batches at d 256 on the
# dense call's 128x80 tile (packed_d256.patch; make trees/main with `git archive HEAD cuflash
# kernels bench` BEFORE applying it) against main's 128x64 with fresh turns per tile, forward,
# 2 rounds in turns. Its packed 128x80 kernels compile spill-free in all eight mask and hook
# forms since the epilogue's fresh loads (CPU, session 30). Predicted: 3-8% less time
# (session 30: d 128's packed calls on the dense tile 5% faster non-causal, d 64's 1-3%).
source bench/device_call.sh
T=bench/results/session30/trees/main
precompile "head_dims=(256,), varlen=True, max_workers=16"
ab_varlen $T 256 8 "1 2"
