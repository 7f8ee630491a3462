#!/bin/bash
# Session 19, call 2: (1) the portable forward's ALiBi, base (.base) against new, two rounds;
# (2) d 64's hooked Hopper forward on B_c 112 (today's) and 128 (the plain tile), two rounds.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
for tree in $PWD $PWD/.base; do
  (cd $tree && PYTHONPATH=$tree timeout 150 python3 -c "import cuflash; print(cuflash.precompile(head_dims=(64, 128), backward=False, windows=True, max_workers=8), 'kernels')" 2>&1 | tail -1) &
done; wait
echo "precompile at $((SECONDS-S))s"
for r in 1 2; do
  for side in base new; do
    tree=$PWD; [ $side = base ] && tree=$PWD/.base
    echo "== round $r: $side"
    PYTHONPATH=$tree timeout 100 python3 bench/results/session19/alibi_sides/portable_alibi.py.txt $tree 2>&1 | grep -v eta
  done
done > $OUT/portable_ab.log 2>&1
cat $OUT/portable_ab.log; echo "portable at $((SECONDS-S))s"
for r in 1 2; do
  echo "== round $r"
  timeout 150 python3 bench/score_hook_bench.py --passes fwd --headdims 64 \
    --seqlens 2048,4096,8192 --configs h112x3pc3,h128x3pc3 --reps 40 \
    --json $OUT/hook_d64_tiles_$r.json 2>&1 | grep -v eta | grep -v "^ *$"
done > $OUT/hook_d64_tiles.log 2>&1
cat $OUT/hook_d64_tiles.log; echo "tiles at $((SECONDS-S))s"
