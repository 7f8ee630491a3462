#!/bin/bash
# Session 16, call C (try-bwd-varlen at 4265581, the landing candidate): the hooked backward's
# cost with the exp2_poly reverted, the bf16 backward grid (issue 18's JSON), then the full
# suite. <= 585 s.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc; [ "$(ls /tmp/kc | wc -l)" -gt 100 ] || cat .diag/kcache/kc.tar.xz.* | tar -xJ -C /tmp/kc
S=$SECONDS
PYTHONPATH=$PWD timeout 50 python3 bench/score_hook_bench.py --passes bwd --headdims 64 --json $OUT/hook_bwd_d64.json 2>&1 | tail -12
echo "hook at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 60 python3 bench/bench.py --grid --passes bwd --dtypes bf16 --providers cuflash,torch-flash,torch-cudnn \
  --reps 20 --warmup 3 --json $OUT/grid_bwd_bf16.json > $OUT/grid_bwd.log 2>&1
echo "grid rc=$? at $((SECONDS-S))s"
PYTEST_ARGS="-n 16 --durations=10" OUT=$OUT timeout $((582-SECONDS+S)) bash bench/gpu_check.sh tests > $OUT/gpu_check.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; tail -4 $OUT/pytest.log
