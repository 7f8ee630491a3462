#!/bin/bash
# Session 25, call 3: the Hopper backward as dependent launches (pdl: trees/pdl) and, on top,
# with a persistent grid for dense calls (new: the working tree), paired against main, bf16;
# then the whole GPU suite on whichever of the two was faster (geometric mean of the A/B's
# times; the other tree's sources are copied over this disposable copy of the working tree).
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
T=bench/results/session25/trees
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu.txt
timeout 100 python3 bench/tree_ab.py --pass bwd --others main=$T/main,pdl=$T/pdl --headdims 64,128 \
  --masks off,on --dtypes bf16 --seqlens 512,2048,16384 --rounds 1 \
  --json $OUT/ab.json > $OUT/ab.log 2>&1
echo "A/B rc=$? at $((SECONDS-S))s"; grep -E "^bwd" $OUT/ab.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
PICK=$(python3 - <<'PY'
import json, math, os
try:
    rows = json.load(open(os.environ["OUT"] + "/ab.json"))["rows"]
    g = lambda k: math.exp(sum(math.log(r["time_over_new"][k]) for r in rows) / len(rows))
    print("new" if g("pdl") >= 1.0 else "pdl", f"{g('main'):.4f}", f"{g('pdl'):.4f}")
except Exception as e:
    print("none", repr(e))
PY
)
echo "geomean time over new's (main, pdl) and the pick: $PICK"
case "$PICK" in
  pdl*) rm -rf cuflash kernels && cp -r $T/pdl/cuflash $T/pdl/kernels . && cp $T/pdl/test_host_path.py tests/ ;;
  new*) ;;
  *) echo "no A/B: the suite runs on the working tree" ;;
esac
PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
for K in 2 1; do  # (the short shard first: where the call's time runs out, one is whole)
  PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 --shard $K/2 \
    > $OUT/pytest_shard_${K}of2.log 2>&1
  echo "suite shard $K/2 rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_shard_${K}of2.log | tail -3
  grep -E "^FAILED" $OUT/pytest_shard_${K}of2.log | head -20
done

