#!/bin/bash
# Session 28, call 3: the Hopper forward's Q_i loaded per consumer warpgroup (working tree:
# each consumer's 64 rows on their own barriers, consumer 0's as soon as its last S of the
# tile before is done) paired against main (trees/main: f3c0dc0) beside cuDNN, d 64, 128,
# 256, causal off and on, bf16, 3 rounds.
source bench/device_call.sh
T=bench/results/session28/trees
precompile "dtypes=('bfloat16',), head_dims=(64, 128, 256), backward=False, max_workers=16"
ab_fwd $T/main
