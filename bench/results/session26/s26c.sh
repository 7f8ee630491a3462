#!/bin/bash
# Session 26, call 3 (280 s of device time left): the forward's causal-tail, split-tail and
# accuracy-grid GPU tests on the final code (the causal tail by
# _registry.CAUSAL_TAIL_MIN_ROW_BLOCKS; the kernel as in call 2 but for a comment).
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc
S=$SECONDS
PYTHONPATH=$PWD timeout 90 python3 -c "import cuflash; print(cuflash.precompile(max_workers=16), 'kernels')" 2>&1 | tail -2
echo "precompile at $((SECONDS-S))s"
PYTHONPATH=$PWD timeout $((255-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
  tests/test_forward_gpu.py -k "causal_tail or split_tail or accuracy_grid" > $OUT/pytest_fwd.log 2>&1
echo "forward tests rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_fwd.log | tail -3
grep -E "^FAILED" $OUT/pytest_fwd.log | head -20
# Then, the machine still warm, the rest of tests/test_forward_gpu.py (call3/pytest_fwd_rest.log):
#   PYTHONPATH=$PWD timeout 150 python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 \
#     tests/test_forward_gpu.py -k "not (causal_tail or split_tail or accuracy_grid)"
