#!/bin/bash
# Session 19, call 3: d 64's hooked Hopper forward (softcap, ALiBi; no window, dense) on the
# plain call's tiles (128x4, three consumers: the short-key one; 128x3, three consumers: the
# long-key one) against today's B_c 112, two rounds.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
S=$SECONDS
for r in 1 2; do
  echo "== round $r"
  timeout 200 python3 bench/score_hook_bench.py --passes fwd --headdims 64 \
    --seqlens 2048,4096,8192,16384 --configs h112x3pc3,h128x3pc3,h128x4pc3,h128x4p --reps 30 \
    --json $OUT/hook_d64_plain_tiles_$r.json 2>&1 | grep -v eta | grep -v "^ *$"
done > $OUT/hook_d64_plain_tiles.log 2>&1
cat $OUT/hook_d64_plain_tiles.log; echo "tiles at $((SECONDS-S))s"
