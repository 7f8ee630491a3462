#!/bin/bash
# Session 29, call 1 (ran; the patch measured no faster and was dropped): the split and causal tails' tile lookups through the
# walk's FastDivs (tail_fastdiv.patch, applied to the working tree; fewer instructions in the
# tail, but ptxas rescheduled the whole kernel: 14-20k SASS lines differ) paired against main
# (trees/main: `git archive HEAD cuflash kernels`, before applying the patch) beside cuDNN,
# forward d 64, 128, 256, causal off and on, bf16, 3 rounds.
source bench/device_call.sh
T=bench/results/session29/trees
precompile "dtypes=('bfloat16',), head_dims=(64, 128, 256), backward=False, max_workers=16"
ab_fwd $T/main
