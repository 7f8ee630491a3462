#!/bin/bash
# Session 27, call 3: the producers' waits for a free slot with a long suspend-time hint
# (mbar_wait_idle: the warp sleeps until the phase completes instead of polling every few
# cycles), paired against main (trees/main: beb141b) beside cuDNN: forward d 64, 128, 256,
# backward d 64, 128, causal off and on, bf16.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session27/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
timeout 250 python3 bench/tree_ab.py --pass fwd --others main=$T/main --headdims 64,128,256 \
  --masks off,on --dtypes bf16 --seqlens 512,1024,2048,4096,8192,16384 --rounds 3 \
  --json $OUT/ab_fwd.json > $OUT/ab_fwd.log 2>&1
echo "A/B fwd rc=$? at $((SECONDS-S))s"; grep -E "^fwd" $OUT/ab_fwd.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
timeout $((585-SECONDS+S)) python3 bench/tree_ab.py --pass bwd --others main=$T/main --headdims 64,128 \
  --masks off,on --dtypes bf16 --seqlens 512,2048,8192,16384 --rounds 2 \
  --json $OUT/ab_bwd.json > $OUT/ab_bwd.log 2>&1
echo "A/B bwd rc=$? at $((SECONDS-S))s"; grep -E "^bwd" $OUT/ab_bwd.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
