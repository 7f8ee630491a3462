#!/bin/bash
# Session 17: the full suite on branch s17's final code, in two shards (one device call each):
#   bash .diag/s17suite.sh 1/2 ; bash .diag/s17suite.sh 2/2
# The kernels are compiled once into CuPy's cache first (one process), so that the 16 pytest
# workers load them instead of each compiling its own copy.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
tag=${1/\//of}
if [ "$(ls /tmp/kc | wc -l)" -lt 100 ]; then
  PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
  echo "precompile at $((SECONDS-S))s"
fi
PYTHONPATH=$PWD timeout $((585-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard $1 \
  > $OUT/pytest_shard_$tag.log 2>&1
echo "suite shard $1 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_$tag.log | tail -3
