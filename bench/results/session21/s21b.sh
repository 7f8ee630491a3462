#!/bin/bash
# Session 21: the GPU suite shard K/2 on the final code (bash bench/results/session21/s21b.sh 1/2),
# shard 2 followed by the backward's and the forward's standard grids.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
tag=${1/\//of}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_$tag.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout $((${2:-585}-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard $1 \
  > $OUT/pytest_shard_$tag.log 2>&1
echo "suite shard $1 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_$tag.log | tail -3
if [ "$1" = 2/2 ]; then
  PYTHONPATH=$PWD timeout $((585-SECONDS+S)) python3 bench/bench.py --grid --passes bwd \
    --headdims 64,128 --dtypes bf16,fp16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
    --json $OUT/grid_bwd.json > $OUT/grid_bwd.log 2>&1
  echo "bwd grid rc=$? at $((SECONDS-S))s"; tail -60 $OUT/grid_bwd.log
fi
