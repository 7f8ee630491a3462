#!/bin/bash
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
S=$SECONDS
timeout 80 python3 .diag/window_rule.py $OUT/window_rule.json 2>&1 | grep -v "^ *$" | tee $OUT/window_rule.log
echo "bench at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 80 python3 -c "import cuflash; print(cuflash.precompile(backward=False, windows=True, varlen=True, max_workers=16), 'kernels')" 2>&1 | tail -1
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 100 python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 tests/test_forward_gpu.py -k "window or shifted or odd_head_dim" > $OUT/pytest_windows.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; tail -2 $OUT/pytest_windows.log
