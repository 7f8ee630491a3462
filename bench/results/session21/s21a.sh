#!/bin/bash
# Session 21, call 1: the backward's split tail (and the forward's count-in, now shared) on the
# H200: the targeted tests, then the paired A/B of the part cost and off, beside cuDNN.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 200 python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_backward_gpu.py tests/test_forward_gpu.py \
  -k "split_tail or accuracy_grid or many_blocks or softcap_and_alibi or default_on_sm90" \
  > $OUT/pytest_targeted.log 2>&1
echo "targeted rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error|FAIL" $OUT/pytest_targeted.log | tail -12
PYTHONPATH=$PWD timeout $((570-SECONDS+S)) python3 bench/results/session21/bwd_split_ab.py \
  --headdims 128,64 --rounds 2 --reps 20 --variants "split:3,cost1:1,cost8:8,off:off" \
  --json $OUT/bwd_split_ab.json 2>&1 | grep -v "^ *$" > $OUT/bwd_split_ab.log
echo "A/B at $((SECONDS-S))s"; cat $OUT/bwd_split_ab.log
