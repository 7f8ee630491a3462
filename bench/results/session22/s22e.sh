#!/bin/bash
# Session 22, call 5: the final tree (the ordered mode back on dK before dQ): the d 128
# backward grid points with the deterministic mode beside, and the deterministic GPU tests.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_e.txt
PYTHONPATH=$PWD timeout 200 python3 bench/bench.py --grid --passes bwd \
  --headdims 128 --dtypes bf16,fp16 --rounds 2 --providers cuflash,torch-cudnn \
  --json $OUT/grid_bwd_d128.json > $OUT/grid_bwd_d128.log 2>&1
echo "grid rc=$? at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout $((400-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_backward_gpu.py -k "determin or ordered" > $OUT/pytest_e.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_e.log | tail -3
