#!/bin/bash
# Session 29, call 4 (issue 18): ncu of the causal d 128 backward at n 8k
# against n 16k (standard grid shapes: batch 2 and 1, 16 heads). Our causal rate falls from n 8k
# to 16k (session 28 call 1: 525 to 510 TFLOP/s, bf16) while cuDNN's rises (512 to 527); L2
# traffic (sessions 24, 28) and the dispatch's balance (a model: 1.002x ideal) are ruled out.
# Compare per block: instructions, issue rate, stall reasons, and where the time goes in the
# SASS (SourceCounters, grouped by execution count with session27's ncu_per_count.py).
source bench/device_call.sh
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats"
for n in 8192 16384; do
  timeout 150 ncu --clock-control none $SEC --section SourceCounters \
    -k regex:"fa2_backward_sm90" --launch-skip 1 --launch-count 1 -o $OUT/bwd_c_$n \
    python3 bench/results/session24/bwd_profile.py 128 $n 1 > $OUT/ncu_bwd_d128_n${n}_c1.log 2>&1
  echo "ncu bwd n=$n rc=$? at $((SECONDS-S))s"
  ncu -i $OUT/bwd_c_$n.ncu-rep --page details > $OUT/ncu_bwd_d128_n${n}_details.log 2>&1
  ncu -i $OUT/bwd_c_$n.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > $OUT/sass_bwd_n$n.csv.gz
  rm -f $OUT/bwd_c_$n.ncu-rep
done
grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Executed Ipc|L2 Hit|DRAM Through" \
  $OUT/ncu_bwd_d128_n*_details.log | cut -c1-160
