#!/bin/bash
# Session 19: the GPU suite in two shards, one device call each, on the final code:
#   bash bench/results/session19/s19d.sh 1/2 ; bash bench/results/session19/s19d.sh 2/2
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
tag=${1/\//of}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_$tag.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout $((585-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard $1 \
  > $OUT/pytest_shard_$tag.log 2>&1
echo "suite shard $1 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_$tag.log | tail -3
