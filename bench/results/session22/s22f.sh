#!/bin/bash
# Session 22, call 6: the d 128 causal backward with dQ through shared memory and dK wholly
# after dQ (this tree) against the committed one (vector reductions, 3 early k-steps) and
# session 21's, paired; then the causal backward GPU tests on this tree.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session22/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_f.txt
PYTHONPATH=$PWD timeout 120 python3 bench/results/session22/bwd_tree_ab.py \
  --others main=$T/main,s21=$T/s21 --headdims 128 --masks on --dtypes bf16 \
  --seqlens 1024,2048,4096,8192,16384 --json $OUT/causal_bulk.json 2>&1 | grep -v "^ *$" > $OUT/causal_bulk.log
echo "A/B at $((SECONDS-S))s"; cat $OUT/causal_bulk.log
PYTHONPATH=$PWD timeout $((250-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_backward_gpu.py > $OUT/pytest_f.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_f.log | tail -3
