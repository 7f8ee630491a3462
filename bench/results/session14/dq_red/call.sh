#!/bin/bash
# Session 14, call D (one H200): the Hopper backward with dQ added by vector reductions from
# the registers (no staging, fence or barrier) and L_i read before the S^T wait, against main
# (7316139, .diag/vbase) in turns (bench/ab.sh, 2 rounds); the bf16 backward grid on it; then
# the full suite on it.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc; [ "$(ls /tmp/kc | wc -l)" -gt 100 ] || cat .diag/kcache/kc.tar.xz.* | tar -xJ -C /tmp/kc
S=$SECONDS
OUT=$OUT/ab timeout 200 bash bench/ab.sh .diag/vbase . --headdims 64,128 --seqlens 1024,2048,8192 --masks off,on --passes bwd > /dev/null 2>&1
echo "ab rc=$? at $((SECONDS-S))s"; cat $OUT/ab/ab_compare.txt
PYTHONPATH=$PWD timeout 90 python3 bench/bench.py --grid --passes bwd --dtypes bf16 --providers cuflash,torch-flash,torch-cudnn \
  --reps 20 --warmup 3 --json $OUT/grid_bwd_bf16.json > $OUT/grid_bwd.log 2>&1
echo "grid rc=$? at $((SECONDS-S))s"
PYTEST_ARGS="-n 16 --durations=10" OUT=$OUT timeout 300 bash bench/gpu_check.sh tests > $OUT/gpu_check.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; tail -3 $OUT/pytest.log
