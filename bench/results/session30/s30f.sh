#!/bin/bash
# Session 30, call 4: the whole GPU suite on this tree (alone in its call).
source bench/device_call.sh
precompile "fa1=True, windows=True, varlen=True, decode=True, max_workers=16"
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 \
  > $OUT/pytest_all.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_all.log | tail -3
