#!/bin/bash
# Session 28, call 4 (the final code): the whole GPU suite, then the forward's standard grid
# (issue 17, with Q_i loaded per consumer warpgroup) and the backward's (issue 18).
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout $((470-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 \
  > $OUT/pytest_all.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_all.log | tail -3
PYTHONPATH=$PWD timeout $((530-SECONDS+S)) python3 bench/bench.py --grid --passes fwd \
  --headdims 64,128,256 --dtypes bf16,fp16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_fwd.json > $OUT/grid_fwd.log 2>&1
echo "fwd grid rc=$? at $((SECONDS-S))s"; tail -1 $OUT/grid_fwd.log
PYTHONPATH=$PWD timeout $((598-SECONDS+S)) python3 bench/bench.py --grid --passes bwd \
  --headdims 64,128 --dtypes bf16,fp16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_bwd.json > $OUT/grid_bwd.log 2>&1
echo "bwd grid rc=$? at $((SECONDS-S))s"; tail -1 $OUT/grid_bwd.log
