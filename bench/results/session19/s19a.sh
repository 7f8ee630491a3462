#!/bin/bash
# Session 19, call 1: ALiBi split on both sides of the diagonal (score.cuh) against the base
# tree (.base = main fd38305, carried), hooked/plain forward, two rounds; then the GPU tests of
# the features (windows with the window-width tile rule, softcap, ALiBi, shifted diagonals).
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc $OUT/ab
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
(cd .base && PYTHONPATH=$PWD timeout 100 python3 -c "import cuflash; print(cuflash.precompile(head_dims=(64, 128), backward=False, windows=True, max_workers=16), 'base kernels')" 2>&1 | tail -2)
echo "base precompile at $((SECONDS-S))s"
for r in 1 2; do
  for side in base new; do
    tree=$PWD; [ $side = base ] && tree=$PWD/.base
    echo "== round $r: $side"
    PYTHONPATH=$tree timeout 120 python3 $tree/bench/score_hook_bench.py --passes fwd \
      --headdims 64,128 --seqlens 2048,4096,8192 --json $OUT/ab/hook_${side}_$r.json 2>&1 \
      | grep -v eta | grep -v "^ *$"
  done
done > $OUT/hook_ab.log 2>&1
cat $OUT/hook_ab.log | head -80
echo "bench at $((SECONDS-S))s"
timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_forward_gpu.py tests/test_kvcache_gpu.py tests/test_backward_gpu.py \
  tests/test_hardening_gpu.py -k "alibi or softcap or window or shifted or feature" \
  > $OUT/pytest_features.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; tail -5 $OUT/pytest_features.log
(cd $OUT && tar czf ab.tgz ab && rm -rf ab)
