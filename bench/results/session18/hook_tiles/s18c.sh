#!/bin/bash
# Session 18 call C: the hooked forward on other Hopper tiles (where ALiBi's cost comes from)
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc
S=$SECONDS
python3 bench/score_hook_bench.py --passes fwd --headdims 128 --seqlens 2048,8192 \
  --configs h176x2pl,h176x2p,h128x2p,h128x2pl --json $OUT/hook_tiles_d128.json > $OUT/hook_tiles.log 2>&1
echo "d128 at $((SECONDS-S))s" >> $OUT/hook_tiles.log
python3 bench/score_hook_bench.py --passes fwd --headdims 64 --seqlens 2048,8192 \
  --configs h112x3pc3,h128x4p,h128x3p --json $OUT/hook_tiles_d64.json >> $OUT/hook_tiles.log 2>&1
echo "d64 at $((SECONDS-S))s" >> $OUT/hook_tiles.log
grep -v "^ *$" $OUT/hook_tiles.log | grep -v eta
