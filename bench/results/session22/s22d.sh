#!/bin/bash
# Session 22, call 4: the GPU suite's shard 2, then the backward's and the forward's standard
# grids (both dtypes, cuDNN and FlashAttention-2 beside).
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_d.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 330 python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard 2/2 \
  > $OUT/pytest_shard_2of2.log 2>&1
echo "suite shard 2/2 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_2of2.log | tail -3
PYTHONPATH=$PWD timeout $((500-SECONDS+S)) python3 bench/bench.py --grid --passes bwd \
  --headdims 64,128 --dtypes bf16,fp16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_bwd.json > $OUT/grid_bwd.log 2>&1
echo "bwd grid rc=$? at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 bench/bench.py --grid --passes fwd \
  --headdims 64,128,256 --dtypes fp16,bf16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_fwd.json > $OUT/grid_fwd.log 2>&1
echo "fwd grid rc=$? at $((SECONDS-S))s"; tail -3 $OUT/grid_fwd.log
