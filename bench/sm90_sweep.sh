#!/usr/bin/env bash
# One device call for the Hopper forward's tuning: correctness of
# the ping-pong kernel, then its tiles against the table's, cuDNN and FA2, kernel timing.
#   bash bench/sm90_sweep.sh     (logs in $OUT, default ./gpu-logs; one file per step)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{
  timeout 90 python3 bench/sm90_check.py
  timeout 240 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_forward_gpu.py \
    tests/test_fuzz_gpu.py tests/test_hardening_gpu.py -x 2>&1 | tail -5
} > "$OUT/sm90_correct.log" 2>&1
{
  for n in 4096 16384; do
    for c in "" "--causal"; do
      b=$((16384 / n))
      timeout 60 python3 bench/bench.py --pass fwd --dtype bf16 --headdim 128 --heads 16 \
        --batch $b --seqlen $n $c --providers cuflash,torch-cudnn --reps 20 \
        --configs h128x2,h128x2p,h176x2p,h160x2p,h128x3p
      timeout 60 python3 bench/bench.py --pass fwd --dtype bf16 --headdim 64 --heads 32 \
        --batch $b --seqlen $n $c --providers cuflash,torch-cudnn --reps 20 \
        --configs h128x3,h128x3p,h192x2p,h176x3p
      timeout 60 python3 bench/bench.py --pass fwd --dtype bf16 --headdim 256 --heads 8 \
        --batch $b --seqlen $n $c --providers cuflash,torch-cudnn --reps 20 \
        --configs h64x2,h64x2p,h80x2p
    done
  done
} > "$OUT/sm90_sweep.log" 2>&1
tail -3 "$OUT/sm90_correct.log"
grep -E "^NVIDIA|cuflash|cudnn " "$OUT/sm90_sweep.log"
