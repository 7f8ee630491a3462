#!/bin/bash
# Session 25, call 3 (the budget left after failed starts holds no whole suite): the Hopper
# backward as dependent launches (pdl: trees/pdl) and, on top, with a persistent grid for
# dense calls (new: the working tree), paired against main, bf16; then the backward's GPU
# tests on the new tree.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session25/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
timeout 100 python3 bench/tree_ab.py --pass bwd --others main=$T/main,pdl=$T/pdl --headdims 64,128 \
  --masks off,on --dtypes bf16 --seqlens 512,2048,16384 --rounds 1 \
  --json $OUT/ab.json > $OUT/ab.log 2>&1
echo "A/B rc=$? at $((SECONDS-S))s"; grep -E "^bwd" $OUT/ab.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
PYTHONPATH=$PWD timeout $((LIMIT-20-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_backward_gpu.py > $OUT/pytest_bwd.log 2>&1
echo "bwd tests rc=$? at $((SECONDS-S))s"; tail -3 $OUT/pytest_bwd.log
grep -E "^FAILED" $OUT/pytest_bwd.log | head -20
