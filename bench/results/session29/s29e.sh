#!/bin/bash
# Session 29, call 5: SM clock and power under sustained load, ours against cuDNN's, at the
# points below target in call 3's grids (bench/power_probe.py): the causal backward at n 8k
# and 16k (d 128 bf16; d 64 fp16), the non-causal backward d 128 n 2048, the forward fp16
# d 128 n 2048 and 4096 against bf16 d 128 n 2048.
source bench/device_call.sh
PYTHONPATH=$PWD timeout 300 python3 bench/power_probe.py --turns 2 --window 1.5 --json $OUT/power.json \
  --points "bwd bf16 128 8192 c,bwd bf16 128 16384 c,bwd fp16 64 16384 c,bwd bf16 128 2048,fwd fp16 128 2048,fwd fp16 128 4096,fwd bf16 128 2048" \
  > $OUT/power.log 2>&1
echo "probe rc=$? at $((SECONDS-S))s"; cat $OUT/power.log | tail -40
