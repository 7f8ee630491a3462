#!/bin/bash
# Session 25, call 1: the dQ pass in 16-byte stores (vec: session 24's staged patch) and, on top
# of it, dQ_accum's zeros written by the D pass (new: the working tree), paired against main;
# both passes under ncu; the backward's cost per tile (bwd_fixed.py); the backward's GPU tests.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session25/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
timeout 230 python3 bench/tree_ab.py --pass bwd --others main=$T/main,vec=$T/vec --headdims 64,128 \
  --masks off,on --dtypes bf16 --seqlens 512,2048,16384 --rounds 2 \
  --json $OUT/ab.json > $OUT/ab.log 2>&1
echo "A/B rc=$? at $((SECONDS-S))s"; grep -E "^bwd" $OUT/ab.log | sed -E 's/; max diff.*//'
timeout 60 ncu --clock-control none -k regex:"dq_bulk|preprocess" --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight python3 bench/results/session24/bwd_profile.py 128 16384 1 \
  > $OUT/ncu_passes_d128_n16k_c1.log 2>&1
echo "ncu rc=$? at $((SECONDS-S))s"; grep -E "preprocess|dq_bulk|Duration|DRAM Thr" $OUT/ncu_passes_d128_n16k_c1.log | cut -c1-150
timeout 90 python3 bench/results/session25/bwd_fixed.py > $OUT/bwd_fixed.log 2>&1
echo "fixed rc=$? at $((SECONDS-S))s"; cat $OUT/bwd_fixed.log | tail -14
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_backward_gpu.py > $OUT/pytest_bwd.log 2>&1
echo "bwd tests rc=$? at $((SECONDS-S))s"; tail -3 $OUT/pytest_bwd.log
