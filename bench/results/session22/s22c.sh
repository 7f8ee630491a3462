#!/bin/bash
# Session 22, call 3: the final dK-around-dQ order against HEAD's tree (d 128 causal, with 3
# early k-steps, and non-causal, with none), then the GPU suite's shard 1.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session22/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_c.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 150 python3 bench/results/session22/bwd_tree_ab.py \
  --others head=$T/head --headdims 128 --masks on --dtypes bf16 \
  --seqlens 1024,2048,4096,8192,16384 --json $OUT/final_causal.json 2>&1 | grep -v "^ *$" > $OUT/final_ab.log
PYTHONPATH=$PWD timeout 100 python3 bench/results/session22/bwd_tree_ab.py \
  --others head=$T/head --headdims 128 --masks off --dtypes bf16,fp16 \
  --seqlens 2048,16384 --json $OUT/final_noncausal.json 2>&1 | grep -v "^ *$" >> $OUT/final_ab.log
echo "A/B at $((SECONDS-S))s"; cat $OUT/final_ab.log
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard 1/2 \
  > $OUT/pytest_shard_1of2.log 2>&1
echo "suite shard 1/2 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_1of2.log | tail -3
