#!/bin/bash
# Session 24, call 3: the Hopper forward's short-key tiles at n 512-4096, non-causal, paired:
# t128 (d 128 up to 2048 keys on 128x128), t128l (the same, lazy rescale), t64 (d 64 short
# keys on two consumers, B_r 128, instead of three) against the working tree.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
T=bench/results/session24/trees
timeout 560 python3 bench/tree_ab.py --pass fwd --others t128=$T/t128,t128l=$T/t128l,t64=$T/t64 \
  --headdims 64,128 --masks off --dtypes bf16,fp16 --seqlens 512,1024,2048,4096 --rounds 3 \
  --json $OUT/short.json 2>&1 | tee $OUT/short.log | tail -40
# the backward's three kernels (D, main, dQ pass) under ncu, causal and not, d 128 n 16k
for c in 1 0; do
  timeout 120 ncu --clock-control none -k regex:fa2_backward --launch-skip 3 --launch-count 3 \
    --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 bench/results/session24/bwd_profile.py 128 16384 $c > $OUT/ncu_bwd_d128_n16k_c$c.log 2>&1
  echo "ncu causal=$c rc=$?"; grep -E "fa2_backward|Duration|Compute \(SM\) Thr|Memory Thr|DRAM Thr|L2 Hit" $OUT/ncu_bwd_d128_n16k_c$c.log | head -30
done
