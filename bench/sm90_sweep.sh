#!/usr/bin/env bash
# One device call for the Hopper forward's tuning (issue 17, round 4): the forward's
# correctness (both families), then three consumer warpgroups (B_r 192, bench notation "c3")
# against the table's tiles and cuDNN, kernel timing, bf16, the standard grid's shapes:
# d 64 at every length (softmax-bound: a third warpgroup puts two softmaxes under each
# one's matmuls), d 128 at n 512-2048 (B_c 64 / 96, what fits 152 registers).
#   bash bench/sm90_sweep.sh     (logs in $OUT, default ./gpu-logs)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n 6"
{
  timeout 90 python3 bench/sm90_check.py
  timeout 240 python3 -m pytest -q $xd -p no:cacheprovider tests/test_forward_gpu.py -x 2>&1 | tail -5
} > "$OUT/sm90_correct.log" 2>&1
point() {  # head dim, seqlen, causal flag, configs
  timeout 90 python3 bench/bench.py --pass fwd --dtype bf16 --headdim "$1" --heads $((2048 / $1)) \
    --batch $((16384 / $2)) --seqlen "$2" $3 --providers cuflash,torch-cudnn --reps 20 --configs "$4"
}
{
  for n in 512 1024 2048 4096 16384; do
    point 64 $n "" h176x3p,h128x4p,h128x3pc3,h128x4pc3,h112x4pc3,h176x3pc3
    point 64 $n --causal h192x2p,h128x4p,h128x3pc3,h128x4pc3,h112x4pc3
  done
  for n in 512 1024 2048; do
    point 128 $n "" h128x2p,h176x2pl,h64x3pc3,h96x2pc3
    point 128 $n --causal h128x2p,h64x3pc3,h96x2pc3
  done
} > "$OUT/sm90_sweep.log" 2>&1
tail -3 "$OUT/sm90_correct.log"
grep -E "^NVIDIA|cuflash|cudnn " "$OUT/sm90_sweep.log"
