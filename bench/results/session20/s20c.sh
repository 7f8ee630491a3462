#!/bin/bash
# Session 20: the GPU suite in two shards, one device call each, on the final code:
#   bash bench/results/session20/s20c.sh 1/2 ; bash bench/results/session20/s20c.sh 2/2
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
# (shard 2 is short: the benches of the final code after it)
if [ "$1" = 2/2 ]; then
  PYTHONPATH=$PWD timeout 150 python3 bench/results/session20/split_tail_ab.py --paired \
    --headdims 128,64,256 --rounds 2 --reps 30 \
    --variants "planner:16,tail:2,no tail:1000000000" --json $OUT/split_tail_paired.json \
    2>&1 | grep -v "^ *$" > $OUT/split_tail_paired.log
  echo "split tail A/B at $((SECONDS-S))s"; cat $OUT/split_tail_paired.log
  PYTHONPATH=$PWD timeout 60 python3 bench/window_bench.py --headdim 64 \
    --heads 32 --seqlens 32768 --passes fwd --no-flex --json $OUT/window_d64.json \
    > $OUT/window_d64.log 2>&1
  echo "windows rc=$? at $((SECONDS-S))s"; tail -8 $OUT/window_d64.log
  PYTHONPATH=$PWD timeout $((585-SECONDS+S)) python3 bench/bench.py --grid --passes fwd \
    --headdims 64,128,256 --dtypes fp16,bf16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
    --json $OUT/grid_fwd.json > $OUT/grid_fwd.log 2>&1
  echo "grid rc=$? at $((SECONDS-S))s"; tail -80 $OUT/grid_fwd.log
fi
