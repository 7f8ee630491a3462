#!/bin/bash
# Session 16, call B (try-bwd-varlen checkout): det round 2 (branch), A/B default bwd next-gpu vs
# branch, the bf16 bwd grid (issue 18 JSON), hook cost, varlen bwd, A/B branch vs all-bulk. <= 560 s.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc; [ "$(ls /tmp/kc | wc -l)" -gt 100 ] || cat .diag/kcache/kc.tar.xz.* | tar -xJ -C /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt
PYTHONPATH=$PWD OUT=$OUT timeout 50 python3 .diag/s16_det_ab.py dqwarp 2 2>&1 | tail -8
echo "det r2 at $((SECONDS-S))s"
P="--headdims 64,128 --seqlens 2048,8192,16384 --masks off,on --passes bwd"
OUT=/tmp/ab1 timeout 120 bash bench/ab.sh .diag/vnext . $P > /dev/null 2>&1; echo "ab1 rc=$? at $((SECONDS-S))s"
cp /tmp/ab1/ab_compare.txt $OUT/ab_next_vs_dqwarp.txt; cat $OUT/ab_next_vs_dqwarp.txt
mkdir -p $OUT/grid
PYTHONPATH=$PWD timeout 110 python3 bench/bench.py --grid --passes bwd --dtypes bf16 --providers cuflash,torch-flash,torch-cudnn \
  --reps 20 --warmup 3 --json $OUT/grid/grid_bwd_bf16.json > $OUT/grid/grid_bwd.log 2>&1
echo "grid rc=$? at $((SECONDS-S))s"; tail -5 $OUT/grid/grid_bwd.log
PYTHONPATH=$PWD timeout 45 python3 bench/score_hook_bench.py --passes bwd --headdims 64 --json $OUT/hook_bwd_d64.json 2>&1 | tail -12
echo "hook at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 100 python3 bench/varlen_bench.py --passes bwd --json $OUT/varlen_bwd.json 2>&1 | tail -14
echo "varlen at $((SECONDS-S))s"
OUT=/tmp/ab2 timeout 110 bash bench/ab.sh . .diag/vbulk $P > /dev/null 2>&1; echo "ab2 rc=$? at $((SECONDS-S))s"
cp /tmp/ab2/ab_compare.txt $OUT/ab_dqwarp_vs_allbulk.txt; cat $OUT/ab_dqwarp_vs_allbulk.txt
cd /tmp && tar czf $OUT/ab_json.tgz ab1 ab2
