#!/bin/bash
# Session 23, call 2: the final backward order (call 1's A/B: none early where it measured
# faster), the whole GPU suite on it (both shards), then the backward's standard grid.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_b.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
for K in 1 2; do
  PYTHONPATH=$PWD timeout $((480-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard $K/2 \
    > $OUT/pytest_shard_${K}of2.log 2>&1
  echo "suite shard $K/2 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_${K}of2.log | tail -3
done
PYTHONPATH=$PWD timeout $((595-SECONDS+S)) python3 bench/bench.py --grid --passes bwd \
  --headdims 64,128 --dtypes bf16,fp16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_bwd.json > $OUT/grid_bwd.log 2>&1
echo "bwd grid rc=$? at $((SECONDS-S))s"; tail -2 $OUT/grid_bwd.log
