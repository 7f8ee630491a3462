#!/bin/bash
# Staged for session 31 (not run; session 29 staged it as s30d.sh), call 2 (issue 18): clocks
# and power of the backward under sustained load, causal against non-causal at n 16k (d 64
# and 128, bf16 and fp16), ours and cuDNN's (bench/power_probe.py). Session 29's call 5: at
# causal n 16k cuDNN's kernel ran at the same clock as ours or higher (d 64 fp16: 1785
# against 1680-1725 MHz) while ours ran at 1740-1770 MHz at non-causal n 2048; our causal
# kernels lose 7.5% of the non-causal rate at n 16k, cuDNN's 2.5%. Does our causal kernel
# draw more power per step than our non-causal one?
source bench/device_call.sh
PYTHONPATH=$PWD timeout 300 python3 bench/power_probe.py --turns 2 --window 1.5 --json $OUT/power_bwd.json \
  --points "bwd bf16 128 16384,bwd bf16 128 16384 c,bwd fp16 64 16384,bwd fp16 64 16384 c,bwd bf16 64 16384 c" \
  > $OUT/power_bwd.log 2>&1
echo "probe rc=$? at $((SECONDS-S))s"; tail -25 $OUT/power_bwd.log
