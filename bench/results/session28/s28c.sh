#!/bin/bash
# Session 28, call 3: the Hopper forward's Q_i loaded per consumer warpgroup (working tree:
# each consumer's 64 rows on their own barriers, consumer 0's as soon as its last S of the
# tile before is done) paired against main (trees/main: f3c0dc0) beside cuDNN, d 64, 128,
# 256, causal off and on, bf16, 3 rounds.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session28/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(dtypes=('bfloat16',), head_dims=(64, 128, 256), backward=False, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
timeout 300 python3 bench/tree_ab.py --pass fwd --others main=$T/main --headdims 64,128,256 \
  --masks off,on --dtypes bf16 --seqlens 512,1024,2048,4096,8192,16384 --rounds 3 \
  --json $OUT/ab_fwd.json > $OUT/ab_fwd.log 2>&1
echo "A/B fwd rc=$? at $((SECONDS-S))s"; grep -E "^fwd" $OUT/ab_fwd.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
