#!/bin/bash
# Session 27, call 4: the forward's tile-boundary and softmax latencies, paired against main
# (trees/main: beb141b) beside cuDNN, bf16, d 64, 128, 256, causal off and on:
#   fd   the tile walk's divisions by a launch constant as multiply-high and shift (FastDiv);
#   fdm  fd + the causal mask's comparisons shared by a lane's two rows, each against a
#        constant + the epilogue's reciprocal and log from the special-function unit;
#   new  fdm + this lane's row maximum as a tree (the working tree).
# Then the forward GPU tests on the working tree.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session27/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
timeout 300 python3 bench/tree_ab.py --pass fwd --others main=$T/main,fd=$T/fd,fdm=$T/fdm \
  --headdims 64,128,256 --masks off,on --dtypes bf16 --seqlens 512,1024,2048,4096,8192,16384 \
  --rounds 3 --json $OUT/ab_fwd.json > $OUT/ab_fwd.log 2>&1
echo "A/B fwd rc=$? at $((SECONDS-S))s"; grep -E "^fwd" $OUT/ab_fwd.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_forward_gpu.py > $OUT/pytest_fwd.log 2>&1
echo "fwd tests rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_fwd.log | tail -3
grep -E "^FAILED" $OUT/pytest_fwd.log | head -20
