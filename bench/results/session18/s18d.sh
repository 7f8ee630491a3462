#!/bin/bash
# Session 18: the hooked forward's tiles by key length (planner), measured, then the suite in
# two shards: bash .diag/s18d.sh 1/2 (with the bench) ; bash .diag/s18d.sh 2/2
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
tag=${1/\//of}
if [ "$tag" = 1of2 ]; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
  python3 bench/score_hook_bench.py --passes fwd --headdims 64 --seqlens 2048,4096,8192 \
    --configs h128x4p,h112x3pc3 --json $OUT/hook_fwd_d64.json > $OUT/hook_fwd.log 2>&1
  python3 bench/score_hook_bench.py --passes fwd --headdims 128 --seqlens 2048,4096,8192 \
    --configs h128x2p,h176x2pl --json $OUT/hook_fwd_d128.json >> $OUT/hook_fwd.log 2>&1
  grep -v "^ *$" $OUT/hook_fwd.log | grep -v eta
  echo "bench at $((SECONDS-S))s"
fi
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout $((585-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard $1 \
  > $OUT/pytest_shard_$tag.log 2>&1
echo "suite shard $1 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_$tag.log | tail -3
