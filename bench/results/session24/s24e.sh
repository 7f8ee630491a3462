#!/bin/bash
# Session 24, call 4: the backward's dQ pass with 16-byte stores (four n8 tiles a thread, a
# quad transpose), paired against main (HEAD), bf16; and the new dQ pass under ncu (call 3 had
# main's: 69 us at d 128, 16k tokens x 16 heads, causal). (The device budget left no room for
# the suite: the change is staged for the next session.)
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
S=$SECONDS
T=bench/results/session24/trees
timeout 130 python3 bench/tree_ab.py --pass bwd --others main=$T/main --headdims 64,128 \
  --masks off,on --dtypes bf16 --seqlens 512,2048,16384 --rounds 2 \
  --json $OUT/dq_pass.json > $OUT/dq_pass.log 2>&1
echo "A/B rc=$? at $((SECONDS-S))s"; grep -E "^bwd" $OUT/dq_pass.log | sed -E 's/; max diff.*//'
timeout 60 ncu --clock-control none -k regex:dq_bulk --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight python3 bench/results/session24/bwd_profile.py 128 16384 1 \
  > $OUT/ncu_dq_pass_d128_n16k_c1.log 2>&1
echo "ncu rc=$? at $((SECONDS-S))s"; grep -E "dq_bulk|Duration|DRAM Thr" $OUT/ncu_dq_pass_d128_n16k_c1.log
