#!/bin/bash
# Staged for session 29 (not run), call 1: the split and causal tails' tile lookups through the
# walk's FastDivs (tail_fastdiv.patch, applied to the working tree; fewer instructions in the
# tail, but ptxas rescheduled the whole kernel: 14-20k SASS lines differ) paired against main
# (trees/main: `git archive HEAD cuflash kernels`, before applying the patch) beside cuDNN,
# forward d 64, 128, 256, causal off and on, bf16, 3 rounds.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session29/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(dtypes=('bfloat16',), head_dims=(64, 128, 256), backward=False, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
timeout 300 python3 bench/tree_ab.py --pass fwd --others main=$T/main --headdims 64,128,256 \
  --masks off,on --dtypes bf16 --seqlens 512,1024,2048,4096,8192,16384 --rounds 3 \
  --json $OUT/ab_fwd.json > $OUT/ab_fwd.log 2>&1
echo "A/B fwd rc=$? at $((SECONDS-S))s"; grep -E "^fwd" $OUT/ab_fwd.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
