#!/bin/bash
# Session 27, call 5: which half of call 4's fdm costs the d 64 non-causal forward 2% at
# n 2k-16k: trees fd + the mask change alone (mask), fd + the epilogue change alone (epi),
# against main, fd and the working tree (new = fdm), bf16 and fp16, d 64.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session27/trees
timeout 300 python3 bench/tree_ab.py --pass fwd --others main=$T/main,fd=$T/fd,mask=$T/mask,epi=$T/epi \
  --headdims 64 --masks off,on --dtypes bf16,fp16 --seqlens 512,2048,8192,16384 \
  --rounds 3 --json $OUT/ab_fwd.json > $OUT/ab_fwd.log 2>&1
echo "A/B fwd rc=$? at $((SECONDS-S))s"; grep -E "^fwd" $OUT/ab_fwd.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/; s/cuDNN.s time.*//'
