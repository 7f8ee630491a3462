#!/bin/bash
# Staged for session 27 (not run): where the d 64 causal n 512 forward's time goes against
# cuDNN's (issue 17's worst point, 0.87x), and the causal against the non-causal d 128
# backward at n 16k (issue 18's steady gap), under ncu with the warp-state and scheduler
# sections (the stall reasons per kernel), fixed clocks off.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
P=bench/results/session26/next
for c in 1 0; do
  timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis \
    -k regex:"fa2_forward_sm90|cudnn|sm90_flash|fmha" --launch-skip 2 --launch-count 2 \
    python3 $P/fwd_profile.py 64 512 $c > $OUT/ncu_fwd_d64_n512_c$c.log 2>&1
  echo "ncu fwd causal=$c rc=$? at $((SECONDS-S))s"
done
for c in 1 0; do
  timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis \
    -k regex:"fa2_backward_sm90" --launch-skip 1 --launch-count 1 \
    python3 bench/results/session24/bwd_profile.py 128 16384 $c > $OUT/ncu_bwd_d128_n16k_c$c.log 2>&1
  echo "ncu bwd causal=$c rc=$? at $((SECONDS-S))s"
done
grep -E "fa2_|cudnn|Duration|Warp Cycles Per Issued|Issue Slots|No Eligible|Stall" $OUT/ncu_*.log | cut -c1-160 | head -80
