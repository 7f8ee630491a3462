#!/usr/bin/env bash
# A/B of two source trees on one GPU in one call: the same grid points, each tree in its own
# process, taking turns, two rounds (a difference between the rounds is the machine's drift).
#   bash bench/ab.sh OLD_TREE [NEW_TREE] [bench.py grid options...]
# OLD_TREE and NEW_TREE (default: this tree) each hold cuflash/, kernels/ and bench/bench.py.
# Default points: bf16, d 64/96/128/256, seqlen 2048/4096/8192, non-causal, forward and
# backward, cuflash and FA2 (torch-flash, the control: it should not move between trees).
# Kernel timing (bench.py); the log goes to $OUT/ab.log (default ./gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
old=$(realpath "$1"); new=$(realpath "${2:-.}"); shift; [ $# -gt 0 ] && shift
opts=${*:---headdims 64,96,128,256 --seqlens 2048,4096,8192 --masks off --passes fwd,bwd}
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
for round in 1 2; do
  for side in old new; do
    tree=$old; [ $side = new ] && tree=$new
    echo "== round $round: $side ($tree)"
    # shellcheck disable=SC2086
    PYTHONPATH=$tree python3 "$tree/bench/bench.py" --grid --providers cuflash,torch-flash \
      --dtypes bf16 --reps 20 --warmup 3 $opts --json "$OUT/ab_${side}_$round.json" 2>&1 \
      | grep -vE "eta|^NVIDIA"
  done
done 2>&1 | tee "$OUT/ab.log"
python3 bench/ab_compare.py "$OUT" | tee "$OUT/ab_compare.txt"
