#!/usr/bin/env bash
# The GPU check that CI (no GPU) cannot run, in one call on a GPU machine:
#   bash bench/gpu_check.sh [tests] [slow] [sanitize] [gqa] [bench] [grid] [parity] [sweep] [demo]
#                           [decode] [varlen] [jax] [ring]
#   (default: tests bench grid parity sweep demo; ring needs a machine of 2+ GPUs)
# PYTEST_ARGS go to the tests step's pytest ("-n 16"; "--shard 1/2" for half of the suite).
# Logs and JSON go to $OUT (default ./gpu-logs). Runs from the working tree (PYTHONPATH=.),
# as on the H200 test machine, where nothing can be pip-installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
steps=${*:-tests bench grid parity sweep demo}
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

for step in $steps; do
  case $step in
    tests)  # the full suite, CPU and GPU tests
      # With pytest-xdist workers (-n), fill CuPy's kernel cache from one process first: each
      # worker's precompile() would otherwise compile its own copy of every kernel at once
      # (session 17 on the H200: 50 backward tests took 185 s that way, mostly compiling;
      # after one precompile() of 80 s, the suite's halves took 176-202 s each).
      case " ${PYTEST_ARGS:-} " in
        *" -n "*) python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, \
varlen=True, decode=True, max_workers=16), 'kernels compiled or loaded')" 2>&1 | tail -1 ;;
      esac
      python3 -m pytest -rfEs -q -s -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 \
        | tee "$OUT/pytest.log" | tail -30
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    slow)  # the slow-marked tests (over 2^31 elements)
      python3 -m pytest -rs -q -s -p no:cacheprovider --slow -m slow 2>&1 \
        | tee "$OUT/pytest_slow.log" | tail -5
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    sanitize)  # compute-sanitizer memcheck and racecheck over every kernel family
      cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
      "$cs" --tool memcheck --error-exitcode 9 python3 bench/sanitize_target.py 2>&1 \
        | tee "$OUT/memcheck.log" | grep -E "SUMMARY|calls done|Error" | head -20
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
      "$cs" --tool racecheck --racecheck-report hazard --error-exitcode 9 \
        python3 bench/sanitize_target.py 2>&1 \
        | tee "$OUT/racecheck.log" | grep -E "SUMMARY|calls done|Error" | head -20
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    gqa)  # GQA backward (32 query heads on 8 kv heads) against FA2, kernel timing
      for c in "" "--causal"; do
        python3 bench/bench.py --pass bwd --dtype bf16 --headdim 128 --batch 4 --heads 32 \
          --kv-heads 8 --seqlen 4096 $c --providers cuflash,torch-flash,torch-cudnn \
          --json "$OUT/gqa_bwd_bf16_d128_n4096${c:+_causal}.json" || status=1
      done ;;
    bench)  # the issues' speed points, side by side with the peers
      for p in fwd bwd; do
        for c in "" "--causal"; do
          python3 bench/bench.py --pass $p --dtype bf16 --headdim 128 --batch 4 --heads 16 \
            --seqlen 4096 $c --json "$OUT/${p}_bf16_d128_n4096${c:+_causal}.json" || status=1
        done
      done ;;
    grid)  # the standard grid, every provider (bench/plot.py, bench/claims.py read the JSON)
      python3 bench/bench.py --grid --reps 20 --warmup 3 --json "$OUT/grid_h200.json" \
        2>&1 | tee "$OUT/grid.log" | grep -E "^\[|failed" ;;
    parity)  # issue 5: cuflash vs FA2 at every grid point and at the other head-dim buckets
      python3 bench/bench.py --grid --providers cuflash,torch-flash --reps 20 --warmup 3 \
        --json "$OUT/grid_h200_parity.json" 2>&1 | tee "$OUT/parity_grid.log" | grep -E "^\[|failed"
      python3 bench/bench.py --grid --providers cuflash,torch-flash --reps 20 --warmup 3 \
        --dtypes bf16 --headdims 32,96,160,192,224,256 --seqlens 4096 \
        --json "$OUT/buckets_h200_parity.json" 2>&1 | tee "$OUT/parity_buckets.log" \
        | grep -E "^\[|failed"
      python3 bench/parity.py "$OUT/grid_h200_parity.json" "$OUT/buckets_h200_parity.json" \
        --out "$OUT/parity_h200.md" && sed -n '/## Summary/,/## Every/p' "$OUT/parity_h200.md" ;;
    sweep)  # tile shapes per head dim (tuning; see PERFORMANCE.md)
      python3 bench/bench.py --headdim 64 --heads 32 --providers cuflash,torch-flash \
        --configs 128x64x8,128x128x8,64x64x4,128x32x4,128x64x4 || status=1
      python3 bench/bench.py --headdim 128 --providers cuflash,torch-flash \
        --configs 128x32x4,128x64x8,64x64x4,128x128x8,64x128x4 || status=1
      python3 bench/bench.py --headdim 128 --causal --providers cuflash,torch-flash \
        --configs 128x32x4,128x64x8,64x64x4,128x128x8 || status=1
      python3 bench/bench.py --headdim 256 --heads 8 --providers cuflash,torch-flash \
        --configs 128x32x8,64x32x4,128x64x8,64x64x4 || status=1 ;;
    demo)
      python3 -m cuflash.demo 2>&1 | tee "$OUT/demo.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    decode)  # issue 20: KV-cache decoding against FA2 and cuDNN (torch), kernel timing
             # (DECODE_ARGS: more options, e.g. "--configs 16x4x3,32x4x2" to sweep tiles)
      python3 bench/decode_bench.py ${DECODE_ARGS:-} --json "$OUT/decode_bench.json" 2>&1 \
        | tee "$OUT/decode_bench.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    varlen)  # issue 19: a packed batch of 64..8192-token sequences against the padded batch
      for d in 128 64; do
        python3 bench/varlen_bench.py --headdim $d --json "$OUT/varlen_d$d.json" 2>&1 \
          | tee "$OUT/varlen_d$d.log"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      done ;;
    jax)  # issue 21: cuflash.jax inside jit against JAX's cuDNN and XLA attention (d 128)
      python3 bench/jax_bench.py ${JAX_ARGS:-} --json "$OUT/jax_bench.json" 2>&1 \
        | tee "$OUT/jax_bench.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    ring)  # issue 22 (2+ GPUs): the distributed tests, then ring attention on 1 and 2 GPUs
      python3 -m pytest -rfEs -q -p no:cacheprovider tests/test_distributed_gpu.py 2>&1 \
        | tee "$OUT/pytest_distributed.log" | tail -5
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
      python3 bench/ring_bench.py --json "$OUT/ring_bench.json" 2>&1 \
        | tee "$OUT/ring_bench.log"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
  esac
done
exit $status
