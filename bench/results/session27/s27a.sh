#!/bin/bash
# Session 27, call 1: session 26's staged ncu runs (the d 64 causal n 512 forward beside
# cuDNN's, issue 17's worst point; the causal against the non-causal d 128 backward at n 16k,
# issue 18's steady gap), stall samples by SASS instruction of the d 64 causal n 512 forward,
# then the forward's standard grid on main (the causal tail in).
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
P=bench/results/session26/next
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats"
for c in 1 0; do
  timeout 120 ncu --clock-control none $SEC \
    -k regex:"fa2_forward_sm90|cudnn|sm90_flash|fmha" --launch-skip 2 --launch-count 2 \
    python3 $P/fwd_profile.py 64 512 $c > $OUT/ncu_fwd_d64_n512_c$c.log 2>&1
  echo "ncu fwd causal=$c rc=$? at $((SECONDS-S))s"
done
timeout 120 ncu --clock-control none --section SourceCounters -k regex:"fa2_forward_sm90" \
  --launch-skip 2 --launch-count 1 -o $OUT/fwd_src python3 $P/fwd_profile.py 64 512 1 > $OUT/ncu_src.log 2>&1
echo "ncu src rc=$? at $((SECONDS-S))s"
ncu -i $OUT/fwd_src.ncu-rep --page source --print-source sass --csv > $OUT/sass_fwd_d64_n512_c1.csv 2>&1
rm -f $OUT/fwd_src.ncu-rep
for c in 1 0; do
  timeout 120 ncu --clock-control none $SEC \
    -k regex:"fa2_backward_sm90" --launch-skip 1 --launch-count 1 \
    python3 bench/results/session24/bwd_profile.py 128 16384 $c > $OUT/ncu_bwd_d128_n16k_c$c.log 2>&1
  echo "ncu bwd causal=$c rc=$? at $((SECONDS-S))s"
done
grep -E "fa2_|cudnn|Duration|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Registers|Theoretical Occ" $OUT/ncu_*.log | cut -c1-160 | head -60
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 bench/bench.py --grid --passes fwd \
  --headdims 64,128,256 --dtypes bf16,fp16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_fwd.json > $OUT/grid_fwd.log 2>&1
echo "fwd grid rc=$? at $((SECONDS-S))s"; tail -2 $OUT/grid_fwd.log
