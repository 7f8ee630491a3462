#!/usr/bin/env bash
# One device call for the Hopper forward's tuning: correctness of the forward (both
# families), then softmax options of the table's tiles against cuDNN, kernel timing:
# l = lazy rescaling of O~, eN = every N-th n8 tile's exponentials on the FMA pipe
# (bench notation hBcxStages[o|p][l][eN], cuflash/_plan.py config_from_shape).
#   bash bench/sm90_sweep.sh     (logs in $OUT, default ./gpu-logs; one file per step)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n 6"
{
  timeout 90 python3 bench/sm90_check.py
  timeout 240 python3 -m pytest -q $xd -p no:cacheprovider tests/test_forward_gpu.py \
    tests/test_fuzz_gpu.py tests/test_hardening_gpu.py -x 2>&1 | tail -5
} > "$OUT/sm90_correct.log" 2>&1
{
  for c in "" "--causal"; do
    timeout 60 python3 bench/bench.py --pass fwd --dtype bf16 --headdim 64 --heads 32 \
      --batch 2 --seqlen 8192 $c --providers cuflash,torch-cudnn --reps 20 \
      --configs h176x3p,h176x3pl,h176x3pe3,h176x3pe2,h176x3ple3
    timeout 60 python3 bench/bench.py --pass fwd --dtype fp16 --headdim 64 --heads 32 \
      --batch 2 --seqlen 8192 $c --providers cuflash,torch-cudnn --reps 20 \
      --configs h176x3p,h176x3pe3,h176x3pe2
    timeout 60 python3 bench/bench.py --pass fwd --dtype bf16 --headdim 128 --heads 16 \
      --batch 4 --seqlen 4096 $c --providers cuflash,torch-cudnn --reps 20 \
      --configs h176x2p,h176x2pl,h176x2pe4,h176x2ple4
    timeout 60 python3 bench/bench.py --pass fwd --dtype bf16 --headdim 256 --heads 8 \
      --batch 2 --seqlen 8192 $c --providers cuflash,torch-cudnn --reps 20 \
      --configs h80x2p,h80x2pl
  done
} > "$OUT/sm90_sweep.log" 2>&1
tail -3 "$OUT/sm90_correct.log"
grep -E "^NVIDIA|cuflash|cudnn " "$OUT/sm90_sweep.log"
