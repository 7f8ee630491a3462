#!/bin/bash
# Session 19, last call: d 64 windows over 32k on the Hopper forward's candidate tiles (data for
# the next session's window rule at d 64), then the decode GPU tests (the new d 64 non-causal
# ALiBi test among them) on the final code.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
S=$SECONDS
timeout 200 python3 bench/results/session19/window_d64/window_d64.py.txt $OUT/window_d64.json > $OUT/window_d64.log 2>&1
echo "bench rc=$? at $((SECONDS-S))s"; grep -v eta $OUT/window_d64.log
timeout $((560-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 tests/test_kvcache_gpu.py > $OUT/pytest_kvcache.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; tail -3 $OUT/pytest_kvcache.log
