#!/bin/bash
# Session 30, call 6 (issue 19, for the next session): variable-length batches at d 128 on the
# dense call's 128x176 tile (fwd_packed; spill-free since PackedSeq::again) against main's
# 128x128 in turns (trees/main: `git archive HEAD cuflash kernels bench`), forward only, 2
# rounds. Predicted: within 2% either way (the mix's short entries waste more of a 176-key
# block; its long ones gain as the dense tile does, 615 against 579 TFLOP/s at n 16k).
source bench/device_call.sh
T=bench/results/session30/trees/main
precompile "head_dims=(128,), varlen=True, max_workers=16"
for r in 1 2; do
  for tree in main new; do
    if [ $tree = main ]; then d=$T; else d=.; fi
    (cd $d && timeout 100 python3 bench/varlen_bench.py --headdim 128 --heads 16 --passes fwd \
      --providers torch-cudnn --json $OUT/varlen_d128_${tree}_$r.json) > $OUT/varlen_d128_${tree}_$r.log 2>&1
    echo "varlen $tree round $r rc=$? at $((SECONDS-S))s"
    grep -E "cuflash-(varlen|padded)" $OUT/varlen_d128_${tree}_$r.log
  done
done
