#!/bin/bash
# Session 30, call 3 (issue 19): variable-length batches at d 64 on the plain call's tile,
# three consumers at B_c 128 (the packed kernels' epilogue reloads the entry's offsets,
# seqinfo.cuh info_again; session 29's main: B_c 112, which spilled less), against main's in
# turns (bench/results/session30/trees/main: `git archive HEAD cuflash kernels bench`), forward
# only (the backward's kernels are unchanged), 2 rounds.
source bench/device_call.sh
T=bench/results/session30/trees/main
precompile "head_dims=(64,), windows=True, varlen=True, max_workers=16"
for r in 1 2; do
  for tree in main new; do
    if [ $tree = main ]; then d=$T; else d=.; fi
    (cd $d && timeout 120 python3 bench/varlen_bench.py --headdim 64 --heads 32 --passes fwd \
      --providers torch-cudnn --json $OUT/varlen_d64_${tree}_$r.json) > $OUT/varlen_d64_${tree}_$r.log 2>&1
    echo "varlen $tree round $r rc=$? at $((SECONDS-S))s"
    grep -E "cuflash-(varlen|padded)|cudnn" $OUT/varlen_d64_${tree}_$r.log
  done
done
