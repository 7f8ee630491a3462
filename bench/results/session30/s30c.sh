#!/bin/bash
# Staged for session 30 (not run), call 3: the forward's standard grid on the final code, its
# rounds paired (--paired: the providers' calls in turns, call by call, under one clock; the
# backward's only if its kernels changed; session 29's call 3 holds both on main, unpaired).
source bench/device_call.sh
PYTHONPATH=$PWD timeout 250 python3 bench/bench.py --grid --passes fwd \
  --headdims 64,128,256 --dtypes bf16,fp16 --rounds 4 --paired --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_fwd.json > $OUT/grid_fwd.log 2>&1
echo "fwd grid rc=$? at $((SECONDS-S))s"; tail -1 $OUT/grid_fwd.log
