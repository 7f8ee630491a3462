#!/bin/bash
# Session 24, call 2: the causal Hopper backward's grid in waves of H (batch, kv head) pairs
# (H = 2, 4, 8 against all kv heads, the new tree, and main), paired, bf16, causal.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
T=bench/results/session24/trees
timeout 560 python3 bench/tree_ab.py --pass bwd --others main=$T/main,h2=$T/h2,h4=$T/h4,h8=$T/h8 \
  --headdims 64,128 --masks on --dtypes bf16 --seqlens 2048,4096,8192,16384 --rounds 3 \
  --json $OUT/waves.json 2>&1 | tee $OUT/waves.log | tail -40
