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

# varlen_bench's forward (bench/varlen_bench.py, cuDNN padded beside it) of the tree at $1
# ("main") and the working tree ("new") in turns, rounds $4 (default "1 2"), head dim $2 and
# heads $3: $OUT/varlen_d$2_{main,new}_ROUND.json and .log, the cuflash rows printed.
ab_varlen() {
  local r tree dir
  for r in ${4:-1 2}; do
    for tree in main new; do
      if [ $tree = main ]; then dir=$1; else dir=.; fi
      (cd $dir && timeout 120 python3 bench/varlen_bench.py --headdim $2 --heads $3 --passes fwd \
        --providers torch-cudnn --json $OUT/varlen_d$2_${tree}_$r.json) > $OUT/varlen_d$2_${tree}_$r.log 2>&1
      echo "varlen $tree round $r rc=$? at $((SECONDS-S))s"
      grep -E "cuflash-(varlen|padded)" $OUT/varlen_d$2_${tree}_$r.log
    done
  done
}
