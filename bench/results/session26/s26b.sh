#!/bin/bash
# Session 26, call 2: the Hopper forward's causal tail (the last units as single tiles, the
# longest first) paired against main (trees/main: 5f460b2) beside cuDNN, causal, d 64, 128,
# 256, bf16; then the whole GPU suite on the working tree in one pytest run.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session26/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
timeout 120 python3 bench/tree_ab.py --pass fwd --others main=$T/main --headdims 64,128,256 \
  --masks on --dtypes bf16 --seqlens 512,1024,2048,4096,8192,16384 --rounds 2 \
  --json $OUT/ab.json > $OUT/ab.log 2>&1
echo "A/B rc=$? at $((SECONDS-S))s"; grep -E "^fwd" $OUT/ab.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
PYTHONPATH=$PWD timeout $((592-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 \
  > $OUT/pytest_all.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_all.log | tail -3
grep -E "^FAILED" $OUT/pytest_all.log | head -20
