#!/bin/bash
# Session 29, call 6: each provider's kernels under sustained load (bench/kernel_trace.py):
# ncu timed our causal d 128 n 16k main backward kernel at 4.66 ms (590 TFLOP/s at 1.76 GHz,
# call 4), but a whole call takes 5.5 ms back to back (call 5): where is the rest?
source bench/device_call.sh
PYTHONPATH=$PWD timeout 300 python3 bench/kernel_trace.py --json $OUT/trace.json \
  --points "bwd bf16 128 16384 c,bwd bf16 128 16384,bwd bf16 128 8192 c,bwd fp16 64 16384 c,fwd fp16 128 2048" \
  > $OUT/trace.log 2>&1
echo "trace rc=$? at $((SECONDS-S))s"; cat $OUT/trace.log | grep -v Warning | tail -70
