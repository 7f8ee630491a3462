#!/bin/bash
# Session 27, call 2: per-SASS-instruction counts and stall samples of our d 64 causal n 512
# forward and of cuDNN's (ncu SourceCounters), gzipped (call 1's CSV was too large to return).
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
P=bench/results/session26/next
for c in 1 0; do
timeout 150 ncu --clock-control none --section SourceCounters --section InstructionStats \
  -k regex:"fa2_forward_sm90|cudnn" --launch-skip 2 --launch-count 2 -o /tmp/src_c$c \
  python3 $P/fwd_profile.py 64 512 $c > $OUT/ncu_src_c$c.log 2>&1
echo "ncu src c=$c rc=$? at $((SECONDS-S))s"
ncu -i /tmp/src_c$c.ncu-rep --page source --print-source sass --csv 2>&1 | gzip > $OUT/sass_d64_n512_c$c.csv.gz
ncu -i /tmp/src_c$c.ncu-rep --page details --print-details all 2>&1 | gzip > $OUT/details_d64_n512_c$c.txt.gz
ls -la $OUT
done
