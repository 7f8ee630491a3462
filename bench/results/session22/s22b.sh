#!/bin/bash
# Session 22, call 2: the d 128 backward with dK split around dQ (DK_EARLY 2: this tree; 1, 0:
# copies) against HEAD's tree, paired in one process beside cuDNN; then the backward GPU tests.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session22/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_b.txt
PYTHONPATH=$PWD timeout 260 python3 bench/results/session22/bwd_tree_ab.py \
  --others head=$T/head,e1=$T/e1,e0=$T/e0 --headdims 128 --masks off --dtypes bf16 \
  --seqlens 1024,2048,4096,8192,16384 --json $OUT/dk_split_bf16.json 2>&1 | grep -v "^ *$" > $OUT/dk_split.log
echo "A/B 1 at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 120 python3 bench/results/session22/bwd_tree_ab.py \
  --others head=$T/head --headdims 128 --masks off --dtypes fp16 \
  --seqlens 2048,16384 --json $OUT/dk_split_fp16.json 2>&1 | grep -v "^ *$" >> $OUT/dk_split.log
PYTHONPATH=$PWD timeout 120 python3 bench/results/session22/bwd_tree_ab.py \
  --others head=$T/head --headdims 64,128 --masks on --dtypes bf16 \
  --seqlens 4096 --json $OUT/dk_split_controls.json 2>&1 | grep -v "^ *$" >> $OUT/dk_split.log
echo "A/B at $((SECONDS-S))s"; cat $OUT/dk_split.log
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_backward_gpu.py > $OUT/pytest_b.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_b.log | tail -5
