#!/bin/bash
# Session 22, call 1: the Hopper forward's two Q_i slots against one (q_ab.py, both dtypes,
# beside cuDNN), then the new q-slot GPU test and the forward tests that reuse slots most.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/gpu_a.txt
PYTHONPATH=$PWD timeout 240 python3 -c "import cuflash; print(cuflash.precompile(fa1=True, windows=True, varlen=True, decode=True, max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout 240 python3 bench/results/session22/q_ab.py --headdims 64,128 \
  --dtypes bf16,fp16 --rounds 2 --reps 20 --json $OUT/q_ab.json 2>&1 | grep -v "^ *$" > $OUT/q_ab.log
echo "A/B at $((SECONDS-S))s"; cat $OUT/q_ab.log
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_forward_gpu.py -k "q_slots or split_tail or many_tiles or windows or softcap" \
  > $OUT/pytest_a.log 2>&1
echo "tests rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_a.log | tail -5
