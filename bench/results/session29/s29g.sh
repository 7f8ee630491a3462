#!/bin/bash
# Session 29, call 7: the backward with and without its dependent launches (pdl_probe.py).
source bench/device_call.sh
PYTHONPATH=$PWD timeout 300 python3 bench/results/session29/pdl_probe.py \
  "bwd bf16 128 16384 c,bwd bf16 128 8192 c,bwd fp16 64 16384 c,bwd bf16 128 16384,bwd bf16 128 2048,bwd fp16 128 2048,bwd bf16 64 512 c" \
  > $OUT/pdl.log 2>&1
echo "pdl probe rc=$? at $((SECONDS-S))s"; grep -v -i warn $OUT/pdl.log | tail -20
