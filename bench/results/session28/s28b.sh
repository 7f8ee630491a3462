#!/bin/bash
# Session 28, call 2: (1) the Hopper backward's causal blocks walking their row blocks from the
# last down (working tree) paired against main (trees/main: f3c0dc0) beside cuDNN, causal
# d 64, 128, bf16; (2) the Hopper forward's d 128 non-causal tile's key width at n 2048 and
# 4096 (standard grid shapes), B_c 176 (the table's), 160, 144 and 128, beside cuDNN.
source bench/device_call.sh
T=bench/results/session28/trees
timeout 300 python3 bench/tree_ab.py --pass bwd --others main=$T/main --headdims 64,128 \
  --masks on --dtypes bf16 --seqlens 2048,4096,8192,16384 --rounds 3 \
  --json $OUT/ab_bwd.json > $OUT/ab_bwd.log 2>&1
echo "A/B bwd rc=$? at $((SECONDS-S))s"; grep -E "^bwd" $OUT/ab_bwd.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
for n in 2048 4096; do
  timeout $((560-SECONDS+S)) python3 bench/bench.py --headdim 128 --heads 16 --batch $((16384/n)) \
    --seqlen $n --configs h176x2pl,h160x2pl,h144x2pl,h128x2pl --providers cuflash,torch-cudnn \
    --rounds 3 > $OUT/fwd_bc_$n.log 2>&1
  echo "fwd B_c n=$n rc=$? at $((SECONDS-S))s"; grep -E "cuflash|cudnn" $OUT/fwd_bc_$n.log | head -8
done
