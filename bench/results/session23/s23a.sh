#!/bin/bash
# Session 23, call 1: session 22's staged backward orders (dQ through shared memory and dK
# wholly after dQ in the causal d 128 kernels without the hook; no early dK k-steps at d 64)
# against main's tree, paired beside cuDNN; then the GPU suite's shard 1 on this tree.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session23/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_a.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 150 python3 bench/tree_ab.py --pass bwd \
  --others main=$T/main --headdims 64,128 --masks on --dtypes bf16,fp16 \
  --seqlens 2048,4096,8192,16384 --json $OUT/ab_causal.json 2>&1 | grep -v "^ *$" > $OUT/ab.log
echo "A/B causal at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 90 python3 bench/tree_ab.py --pass bwd \
  --others main=$T/main --headdims 64 --masks off --dtypes bf16,fp16 \
  --seqlens 2048,8192,16384 --json $OUT/ab_noncausal.json 2>&1 | grep -v "^ *$" >> $OUT/ab.log
echo "A/B at $((SECONDS-S))s"; cat $OUT/ab.log
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard 1/2 \
  > $OUT/pytest_shard_1of2.log 2>&1
echo "suite shard 1/2 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_1of2.log | tail -3
