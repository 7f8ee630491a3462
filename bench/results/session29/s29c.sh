#!/bin/bash
# Session 29, call 3: the forward's standard grid with 4 rounds (session
# 28's 2 rounds left a point 7% apart between rounds) and the backward's with 3.
source bench/device_call.sh
PYTHONPATH=$PWD timeout 250 python3 bench/bench.py --grid --passes fwd \
  --headdims 64,128,256 --dtypes bf16,fp16 --rounds 4 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_fwd.json > $OUT/grid_fwd.log 2>&1
echo "fwd grid rc=$? at $((SECONDS-S))s"; tail -1 $OUT/grid_fwd.log
PYTHONPATH=$PWD timeout $((595-SECONDS+S)) python3 bench/bench.py --grid --passes bwd \
  --headdims 64,128 --dtypes bf16,fp16 --rounds 3 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_bwd.json > $OUT/grid_bwd.log 2>&1
echo "bwd grid rc=$? at $((SECONDS-S))s"; tail -1 $OUT/grid_bwd.log
