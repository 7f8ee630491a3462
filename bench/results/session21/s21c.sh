#!/bin/bash
# Session 21, call 4: the causal backward's grid by column blocks (the longest tiles first)
# against HEAD's tree (bench/results/session21/head_tree, 28cefab's cuflash and kernels), in
# one process; the targeted tests first.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 200 python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_backward_gpu.py tests/test_hardening_gpu.py tests/test_fuzz_gpu.py \
  > $OUT/pytest_targeted.log 2>&1
echo "targeted rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error|FAIL" $OUT/pytest_targeted.log | tail -12
for a in "--headdims 128,64 --dtype bf16" "--headdims 128 --dtype fp16"; do
  PYTHONPATH=$PWD timeout $((580-SECONDS+S)) python3 bench/results/session21/tree_ab.py \
    --other bench/results/session21/head_tree --causal $a --rounds 2 --reps 20 \
    --json $OUT/causal_ab_${a##* }.json 2>&1 | grep -v "^ *$" >> $OUT/causal_ab.log
done
echo "A/B at $((SECONDS-S))s"; cat $OUT/causal_ab.log
