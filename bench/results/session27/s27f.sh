#!/bin/bash
# Session 27, call 6, on the code to land: the whole GPU suite in one pytest run; then the
# forward paired against main (trees/main: beb141b) and call 4's fdm beside cuDNN (bf16, d 64,
# 128, 256; fp16 d 64); then the forward's standard grid against cuDNN and FlashAttention-2.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session27/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout $((500-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 \
  > $OUT/pytest_all.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_all.log | tail -3
grep -E "^FAILED" $OUT/pytest_all.log | head -20
timeout $((545-SECONDS+S)) python3 bench/tree_ab.py --pass fwd --others main=$T/main,fdm=$T/fdm \
  --headdims 64,128,256 --masks off,on --dtypes bf16 --seqlens 512,1024,2048,4096,8192,16384 \
  --rounds 2 --json $OUT/ab_fwd.json > $OUT/ab_fwd.log 2>&1
echo "A/B fwd rc=$? at $((SECONDS-S))s"; grep -E "^fwd" $OUT/ab_fwd.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
PYTHONPATH=$PWD timeout $((595-SECONDS+S)) python3 bench/bench.py --grid --passes fwd \
  --headdims 64,128,256 --dtypes bf16,fp16 --rounds 2 --providers cuflash,torch-flash,torch-cudnn \
  --json $OUT/grid_fwd.json > $OUT/grid_fwd.log 2>&1
echo "fwd grid rc=$? at $((SECONDS-S))s"; tail -2 $OUT/grid_fwd.log
