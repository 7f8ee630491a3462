#!/bin/bash
# Session 20, call 2: the split tail with its merge's loads four iterations at a time: on at
# every tile length, the planner's rule (16 column blocks and up) and off, in turns, beside
# cuDNN; the split-tail GPU tests.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 300 python3 bench/results/session20/split_tail_ab.py \
  --headdims 128,64,256 --rounds 3 --variants "tail:2,planner:16,no tail:1000000000" \
  --json $OUT/split_tail_ab2.json 2>&1 | grep -v "^ *$" > $OUT/split_tail_ab2.log
echo "bench at $((SECONDS-S))s"; cat $OUT/split_tail_ab2.log
timeout $((580-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 8 \
  tests/test_forward_gpu.py -k "split_tail" > $OUT/pytest_split_tail.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; tail -3 $OUT/pytest_split_tail.log
