#!/bin/bash
# Session 17, call A: the hooked backward at d 128 on the Hopper kernel (branch s17): its GPU
# tests, then its cost against the plain kernel (score_hook_bench), and main's (portable) for d 128.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 230 python3 -m pytest -q -p no:cacheprovider -n 16 tests/test_backward_gpu.py \
  -k "softcap or default_on_sm90 or shifted_diagonal or window" > $OUT/pytest_hook.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; tail -4 $OUT/pytest_hook.log
PYTHONPATH=$PWD timeout 100 python3 bench/score_hook_bench.py --passes bwd --json $OUT/hook_bwd_s17.json 2>&1 | tail -12
echo "hook at $((SECONDS-S))s"
PYTHONPATH=$PWD/.diag/vmain timeout 60 python3 .diag/vmain/bench/score_hook_bench.py --passes bwd --headdims 128 --json $OUT/hook_bwd_d128_main.json 2>&1 | tail -6
echo "main hook at $((SECONDS-S))s"
