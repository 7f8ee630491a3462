#!/bin/bash
# Session 17, call C (branch try-dq-late): d 64 backward with dQ split between the consumers
# (DQ_SPLIT): gradients on a few shapes, then main vs branch, bwd d 64, two rounds in turns.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc
S=$SECONDS
PYTHONPATH=$PWD timeout 100 python3 .diag/s17c_acc.py 2>&1 | tail -12; echo "acc rc=${PIPESTATUS[0]} at $((SECONDS-S))s"
P="--grid --providers cuflash --dtypes bf16 --headdims 64 --seqlens 2048,8192 --masks off,on --passes bwd --reps 20 --warmup 3"
for r in 1 2; do
  PYTHONPATH=$PWD/.diag/vmain17 timeout 45 python3 .diag/vmain17/bench/bench.py $P --json $OUT/ab_old_$r.json 2>&1 | grep -E "^\[|cuflash" | tail -4
  PYTHONPATH=$PWD timeout 45 python3 bench/bench.py $P --json $OUT/ab_new_$r.json 2>&1 | grep -E "^\[|cuflash" | tail -4
  echo "round $r at $((SECONDS-S))s"
done
python3 bench/ab_compare.py $OUT 2>&1 | tail -12
