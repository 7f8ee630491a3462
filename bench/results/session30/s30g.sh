#!/bin/bash
# Session 30, call 6 (issue 19, for the next session): variable-length batches at d 128 on the
# dense call's 128x176 tile (fwd_packed; spill-free since PackedSeq::again) against main's
# 128x128 in turns (trees/main: `git archive HEAD cuflash kernels bench`), forward only, 2
# rounds. Predicted: within 2% either way (the mix's short entries waste more of a 176-key
# block; its long ones gain as the dense tile does, 615 against 579 TFLOP/s at n 16k).
source bench/device_call.sh
T=bench/results/session30/trees/main
precompile "head_dims=(128,), varlen=True, max_workers=16"
ab_varlen $T 128 16 "1 2"
