# Sourced by the per-call scripts of the device machine (bench/results/session*/s*.sh, run
# from the repository root with $OUT set): the compile caches under /tmp/kc, unbuffered
# output, the GPU's clocks in $OUT/gpu.txt, and S, the call's start, for each step's "at Ns".
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/gpu.txt"

# cuflash.precompile(ARGS), ARGS its keyword arguments as Python ("max_workers=16, fa1=True")
precompile() {
  PYTHONPATH=$PWD timeout 200 python3 -c "import cuflash; print(cuflash.precompile($1), 'kernels')" 2>&1 | tail -2
  echo "precompile at $((SECONDS-S))s"
}

# The working tree's forward paired against the tree at $1 (bench/tree_ab.py, name "main") at
# the standard grid's points, causal off and on, 3 rounds: dtypes $2 (default bf16), head
# dims $3 (default 64,128,256); the rows in $OUT/$4.json and .log (default ab_fwd), the ratios
# printed.
ab_fwd() {
  local out=${4:-ab_fwd}
  timeout 300 python3 bench/tree_ab.py --pass fwd --others main="$1" --headdims ${3:-64,128,256} \
    --masks off,on --dtypes ${2:-bf16} --seqlens 512,1024,2048,4096,8192,16384 --rounds 3 \
    --json $OUT/$out.json > $OUT/$out.log 2>&1
  echo "A/B fwd ${2:-bf16} rc=$? at $((SECONDS-S))s"
  grep -E "^fwd" $OUT/$out.log | sed -E 's/; max diff.*//; s/ TFLOP.s; time/; time/'
}
