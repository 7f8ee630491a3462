#!/bin/bash
# Session 29, call 2: the whole GPU suite alone on the final code (in
# session 28 it shared a call with both grids and the time limit cut it at 99%: on a fresh
# machine the compile check of every specialisation runs cold inside the suite).
source bench/device_call.sh
precompile "fa1=True, windows=True, varlen=True, decode=True, max_workers=16"
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 \
  > $OUT/pytest_all.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_all.log | tail -3
