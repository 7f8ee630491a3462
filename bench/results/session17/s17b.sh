#!/bin/bash
# Session 17, call B (branch s17: the d 128 hook via LATE_DP, the d 64 per-feature loops): the hooked
# backward's GPU tests, the hook's cost forward and backward (d 64/128), the window bench.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider -n 16 tests/test_backward_gpu.py \
  -k "softcap or alibi or default_on_sm90 or varlen" > $OUT/pytest_hook.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; tail -3 $OUT/pytest_hook.log
PYTHONPATH=$PWD timeout 150 python3 bench/score_hook_bench.py --json $OUT/hook_s17.json > $OUT/hook_s17.log 2>&1
echo "hook rc=$? at $((SECONDS-S))s"; grep -v " plain  *1.000x" $OUT/hook_s17.log | tail -40
PYTHONPATH=$PWD timeout 150 python3 bench/window_bench.py --json $OUT/window_s17.json > $OUT/window_s17.log 2>&1
echo "window rc=$? at $((SECONDS-S))s"; tail -20 $OUT/window_s17.log
