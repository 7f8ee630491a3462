#!/bin/bash
# Session 20, call 1: the split tail (fa2_forward_sm90.cu) and the d 64 window rule: the
# forward GPU tests they touch, then the split tail on and off in turns beside cuDNN.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
timeout 200 python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_forward_gpu.py tests/test_backward_gpu.py tests/test_fuzz_gpu.py \
  -k "split_tail or window or shifted or long_key or accuracy_grid or strided" \
  > $OUT/pytest_call1.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; tail -4 $OUT/pytest_call1.log
PYTHONPATH=$PWD timeout $((560-SECONDS+S)) python3 bench/results/session20/split_tail_ab.py \
  --headdims 128,64,256 --rounds 2 --json $OUT/split_tail_ab.json 2>&1 | grep -v "^ *$" \
  > $OUT/split_tail_ab.log
echo "bench at $((SECONDS-S))s"; cat $OUT/split_tail_ab.log
