#!/bin/bash
# Session 21, call 5: the causal backward's grid by entry (kv heads, T_c, batch) against HEAD's
# tree (28cefab), in one process; then the suite's shard 1 on this tree.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
for a in "--headdims 128,64 --dtype bf16" "--headdims 128 --dtype fp16"; do
  PYTHONPATH=$PWD timeout 100 python3 bench/results/session21/tree_ab.py \
    --other bench/results/session21/head_tree --causal $a --rounds 2 --reps 20 \
    --json $OUT/causal_ab_${a##* }.json 2>&1 | grep -v "^ *$" >> $OUT/causal_ab.log
done
echo "A/B at $((SECONDS-S))s"; cat $OUT/causal_ab.log
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard 1/2 \
  > $OUT/pytest_shard_1of2.log 2>&1
echo "suite shard 1/2 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_1of2.log | tail -3
