#!/bin/bash
# Session 29, call 8 (ran; the change measured 4-8% slower at d 128 and was dropped: narrow_pv.patch; the suite, on the dropped change, was cut at 100% by the device budget): P~V's k-steps only over the keys a consumer's rows see (the last,
# partial block of K; the causal diagonal) in the Hopper forward, paired against main
# (trees/main: `git archive HEAD cuflash kernels` before the change) beside cuDNN: bf16 at
# d 64, 128, 256 (ab_fwd), then fp16 at d 128; then the whole suite on it with the time left.
source bench/device_call.sh
T=bench/results/session29/trees
precompile "head_dims=(64, 128, 256), backward=False, max_workers=16"
ab_fwd $T/main
timeout 120 python3 bench/tree_ab.py --pass fwd --others main=$T/main --headdims 128 \
  --masks off,on --dtypes fp16 --seqlens 512,1024,2048,4096,8192,16384 --rounds 3 \
  --json $OUT/ab_fwd_fp16.json > $OUT/ab_fwd_fp16.log 2>&1
echo "A/B fwd fp16 rc=$? at $((SECONDS-S))s"
grep -E "^fwd" $OUT/ab_fwd_fp16.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
grep -h -o "max diff.*" $OUT/ab_fwd.log $OUT/ab_fwd_fp16.log | sort | uniq -c | head -5
precompile "fa1=True, windows=True, varlen=True, decode=True, max_workers=16"
PYTHONPATH=$PWD timeout $((560-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 \
  > $OUT/pytest_all.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_all.log | tail -3
